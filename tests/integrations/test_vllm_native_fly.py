"""vLLM's own FLy sampler against loosespec's rule and the transcription of vLLM's rule (``make test-vllm``).

Runs in vLLM's environment (``make vllm``; loosespec is installed there without its dependencies), as a script:
the same hand-built and >= 300 seeded random greedy batches as tests/verify/test_fly_conformance.py, verified by
vLLM's native entry points (vLLM 0.33's V1 ``vllm.v1.sample.rejection_sampler.rejection_sample`` and 0.34's V2
``vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils.rejection_sample``, whichever take ``fly_window_size``) and
by loosespec's vLLM-layout rule (:func:`loosespec.integrations.vllm.rule.fly_rejection_sample`, window boundary):
identical emitted tokens, request by request.

Skipped where vLLM's environment is absent or its vLLM has no native FLy (the plugin's own test,
tests/integrations/test_vllm_integration.py, runs against such a vLLM), and where vLLM's native sampler cannot
run here: it is Triton GPU code, so on a CPU-only machine the script reports that instead of a result."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from loosespec.eval.peers.vllm import DEFAULT_VLLM
from loosespec.integrations.vllm.native import probe

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not Path(DEFAULT_VLLM).exists(), reason=f"no vLLM at {DEFAULT_VLLM} (make vllm)"),
]

TESTS = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import inspect, json, sys, types
    import torch
    sys.path.insert(0, TESTS)
    from fakes.fly_reference import THETAS, logits_for, random_round, vllm_native_greedy
    from loosespec.integrations.vllm.rule import FlySettings, fly_rejection_sample

    import importlib

    device = "cuda" if torch.cuda.is_available() else "cpu"
    entries, problems = {}, {}
    for name, module in (("v1", "vllm.v1.sample.rejection_sampler"),
                         ("v2", "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils")):
        try:
            fn = importlib.import_module(module).rejection_sample
        except Exception as e:  # absent in this release (0.34 has no V1 runner), or not importable here
            problems[name] = f"{module}: {type(e).__name__}: {str(e)[:200]}"
            continue
        if "fly_window_size" in inspect.signature(fn).parameters:
            entries[name] = fn
        else:
            problems[name] = f"{module}.rejection_sample takes no fly_window_size"
    if not entries:
        print("RESULT " + json.dumps({"error": "no native FLy sampler entry point", "problems": problems}))
        sys.exit(0)

    def run_v1(fn, requests, big_k, w, theta):
        drafts = [torch.tensor(d, dtype=torch.int32) for d, _ in requests]
        num = [len(d) for d in drafts]
        md = types.SimpleNamespace(all_greedy=True, all_random=False, temperature=None, generators={})
        out = fn(torch.cat(drafts).to(device), num, big_k,
                 torch.tensor(num, dtype=torch.int32).cumsum(0).to(torch.int32).to(device), None,
                 torch.cat([z[:len(d)] for d, z in requests]).float().contiguous().to(device),
                 torch.stack([z[len(d)].argmax() for d, z in requests]).view(-1, 1).to(torch.int32).to(device), md,
                 fly_window_size=w, fly_entropy_threshold=theta, fly_entropy_top_k=3)
        return [[t for t in row if t != -1] for row in out.cpu().tolist()]

    def run_v2(fn, requests, big_k, w, theta):
        rows, inputs, cu, pos = [], [], [0], []
        for d, z in requests:
            rows.append(z[: len(d) + 1])
            inputs += [0] + list(d)  # each logits row's input token: the last kept one, then the drafts
            pos += list(range(100, 101 + len(d)))
            cu.append(cu[-1] + len(d) + 1)
        r = len(requests)
        local = [i - cu[j] for j in range(r) for i in range(cu[j], cu[j + 1])]
        owner = [j for j in range(r) for _ in range(cu[j], cu[j + 1])]
        t = lambda x, dt=torch.int64: torch.tensor(x, dtype=dt, device=device)
        sampled, num_sampled = fn(torch.cat(rows).float().contiguous().to(device), None, t(inputs), t(cu, torch.int32),
                                  t(pos), t(list(range(r)), torch.int32), t(owner, torch.int32), t(local, torch.int32),
                                  torch.zeros(r, device=device), t([0] * r), big_k,
                                  fly_window_size=w, fly_entropy_threshold=theta, fly_entropy_top_k=3)
        return [row[:n] for row, n in zip(sampled.cpu().tolist(), num_sampled.cpu().tolist())]

    runners = {"v1": run_v1, "v2": run_v2}
    g = torch.Generator().manual_seed(46)
    batches = []
    T8 = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    for miss, flat, w in ((5, {5}, 2), (4, {4}, 2), (1, set(), 2), (1, {1}, 2)):
        d = T8[:8].copy(); d[miss] = 0
        batches.append(([(d, logits_for(T8, flat=flat))], 8, w, 0.3))
    while len(batches) < 304:
        big_k = int(torch.randint(2, 16, (1,), generator=g))
        w = int(torch.randint(1, big_k, (1,), generator=g))
        theta = [t for t in THETAS if t != float("inf")][int(torch.randint(0, len(THETAS) - 1, (1,), generator=g))]
        reqs = [random_round(g, int(torch.randint(0, big_k + 1, (1,), generator=g)), theta)
                for _ in range(int(torch.randint(1, 7, (1,), generator=g)))]
        batches.append((reqs, big_k, w, theta))
    report = {"device": device, "entries": sorted(entries), "batches": len(batches), "requests": 0,
              "agree": {e: 0 for e in entries}, "disagree": {e: [] for e in entries}}
    for reqs, big_k, w, theta in batches:
        drafts = [torch.tensor(d, dtype=torch.long) for d, _ in reqs]
        num = [len(d) for d in drafts]
        ours, _ = fly_rejection_sample(torch.cat(drafts), num, big_k, torch.tensor(num).cumsum(0), None,
                                       torch.cat([z[:len(d)] for d, z in reqs]),
                                       torch.stack([z[len(d)].argmax() for d, z in reqs]).view(-1, 1), None,
                                       FlySettings(fly_window_size=w, fly_entropy_threshold=theta))
        ours = [[t for t in row if t != -1] for row in ours.tolist()]
        ref = [vllm_native_greedy(d, z, theta, w) for d, z in reqs]
        assert ours == ref, (ours, ref)
        report["requests"] += len(reqs)
        for name, fn in entries.items():
            try:
                got = runners[name](fn, reqs, big_k, w, theta)
            except Exception as e:
                if device == "cpu":
                    report["skip"] = (f"vLLM's native FLy sampler ({name}) does not run on this CPU-only machine "
                                      f"({type(e).__name__}: {str(e)[:200]})")
                    print("RESULT " + json.dumps(report))
                    sys.exit(0)
                raise
            for i, (a, b) in enumerate(zip(got, ours)):
                if a == b:
                    report["agree"][name] += 1
                elif len(report["disagree"][name]) < 5:
                    report["disagree"][name].append({"draft": reqs[i][0], "w": w, "theta": theta, "vllm": a,
                                                     "loosespec": b})
    print("RESULT " + json.dumps(report))
""")


def test_vllms_native_fly_sampler_decides_as_loosespec():
    found = probe(DEFAULT_VLLM)
    if not found.native:
        pytest.skip(f"the vLLM at {DEFAULT_VLLM} has no native FLy ({found.reason}); the plugin's test covers it")
    proc = subprocess.run(
        [DEFAULT_VLLM, "-c", f"TESTS = {str(TESTS)!r}\n" + SCRIPT], capture_output=True, text=True, timeout=1800
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(line[len("RESULT ") :])
    print(f"\nvLLM {found.version} native FLy vs loosespec: {json.dumps(report)}")
    assert "error" not in report, f"vLLM says it has FLy natively, but: {report}"
    if "skip" in report:
        pytest.skip(report["skip"])
    assert report["batches"] >= 300
    for name in report["entries"]:
        assert report["agree"][name] == report["requests"], report["disagree"][name]
