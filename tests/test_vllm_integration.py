"""vLLM with the loosespec plugin on the default Qwen pair (``make test-vllm``; needs ``make vllm``).

Skipped where vLLM's environment is absent; deselected from ``make test``. Starts ``vllm serve``
three times (each start compiles the model: minutes on a CPU)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from loosespec.vllm.runner import DEFAULT_VLLM, VllmServer, VllmSettings, vllm_generate

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not Path(DEFAULT_VLLM).exists(), reason=f"no vLLM at {DEFAULT_VLLM} (make vllm)")]

PROMPTS = ["Write a Python function `is_prime(n)` with a docstring and three doctests.",
           "Explain in three sentences why the sky is blue."]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import AutoTokenizer

    from loosespec.models import resolve
    from loosespec.text import encode_prompt

    target = str(resolve("qwen2.5-coder-1.5b-instruct").path)
    draft = str(resolve("qwen2.5-coder-0.5b-instruct").path)
    tok = AutoTokenizer.from_pretrained(target)
    prompts = [[int(i) for i in encode_prompt(tok, p)] for p in PROMPTS]
    log = Path(os.environ.get("LOOSESPEC_VLLM_TEST_LOG", tmp_path_factory.mktemp("vllm") / "vllm.log"))
    return VllmSettings(target=target, draft=draft, num_speculative_tokens=5), prompts, log


def run(method, settings, prompts, log):
    outs = []
    with VllmServer(method, settings, log) as srv:
        for ids in prompts:
            text, token_ids, wall, delta, _ = vllm_generate(srv.base_url, ids, max_new_tokens=96, temperature=0.0,
                                                            seed=0)
            outs.append((token_ids, delta))
    return outs


def test_fly_with_the_gate_closed_is_exact_and_fly_accepts_more(setup):
    settings, prompts, log = setup
    exact = run("vllm-draft", settings, prompts, log)
    closed = run("vllm-fly", dataclasses.replace(settings, fly_entropy_threshold=float("inf")), prompts, log)
    assert [t for t, _ in closed] == [t for t, _ in exact]  # FLy that never loosens = vLLM's greedy verification
    fly = run("vllm-fly", settings, prompts, log)

    def tau(outs):
        drafts = sum(d["drafts"] for _, d in outs)
        return 1 + sum(d["accepted"] for _, d in outs) / drafts

    print(f"mean accepted length: exact {tau(exact):.2f}, fly {tau(fly):.2f}")
    assert tau(fly) > tau(exact)
