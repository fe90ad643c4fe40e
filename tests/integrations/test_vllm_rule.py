"""FLy on vLLM-shaped tensors (loosespec.integrations.vllm), without vLLM: flattened drafts of several requests
with different draft lengths, -1 padding, greedy and sampled rows, and the plugin's patching."""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch

from loosespec.integrations.vllm.rule import FlySettings, fly_rejection_sample, fly_rejection_sample_v2, resolve
from loosespec.verify.exact import greedy_verify
from loosespec.verify.fly import fly_verify_greedy, fly_verify_rejection

V = 12


def logits_for(tokens, sharp=(), flat=(), generator=None):
    """[len(tokens), V] logits whose argmax is ``tokens``; rows in ``flat`` are uncertain (high top-3
    entropy), the others confident."""
    z = torch.randn(len(tokens), V, generator=generator) * 0.1 if generator is not None else torch.zeros(len(tokens), V)
    for j, t in enumerate(tokens):
        if j in flat:
            z[j, t] += 0.3
            z[j, (t + 1) % V] += 0.2
            z[j, (t + 2) % V] += 0.1
        else:
            z[j, t] += 8.0
    return z


def batch(requests):
    """Flatten [(draft tokens, target logits [K+1, V])] into vLLM's layout."""
    drafts = [torch.tensor(d, dtype=torch.long) for d, _ in requests]
    num = [len(d) for d in drafts]
    cu = torch.tensor(num).cumsum(0)
    draft_ids = torch.cat(drafts) if sum(num) else torch.empty(0, dtype=torch.long)
    target = torch.cat([z[: len(d)] for d, z in requests])  # rows predicting each draft token
    bonus = torch.stack([z[len(d)].argmax() for d, z in requests]).view(-1, 1)  # what vLLM samples beforehand
    return draft_ids, num, cu, target, bonus


def verify(reqs, settings, is_greedy=None, **kwargs):
    draft_ids, num, cu, target, bonus = batch(reqs)
    return fly_rejection_sample(draft_ids, num, 9, cu, None, target, bonus, is_greedy, settings, **kwargs)


def row(out, i):
    r = out[i].tolist()
    assert all(t == -1 for t in r[r.index(-1) :]) if -1 in r else True  # padding only at the end
    return [t for t in r if t != -1]


def make_requests():
    g = torch.Generator().manual_seed(1)
    # request 0: one mismatch at an uncertain position (1), then 6 matches: FLy defers it
    d0 = [3, 5, 7, 1, 2, 9, 4, 6, 8]
    t0 = [3, 4, 7, 1, 2, 9, 4, 6, 8, 0]
    # request 1: no draft this step
    # request 2: a mismatch where the target is confident: rejected either way
    d2 = [1, 1, 2]
    t2 = [1, 3, 2, 5]
    # request 3: all accepted: the bonus token follows
    d3 = [4, 4]
    t3 = [4, 4, 11]
    return [
        (d0, logits_for(t0, flat={1}, generator=g)),
        ([], logits_for([10], generator=g)),
        (d2, logits_for(t2, generator=g)),
        (d3, logits_for(t3, generator=g)),
    ]


def test_greedy_batch_matches_the_engine_rule_per_request():
    reqs = make_requests()
    s = FlySettings()
    out, events = verify(reqs, s)
    assert out.shape == (4, 10) and out.dtype == torch.int32
    theta, w, top_k, boundary = resolve(s, 9)  # unset: vLLM's defaults, W = min(6, K - 1)
    assert (theta, w, top_k, boundary) == (0.3, 6, 3, "window")
    for i, (d, z) in enumerate(reqs):
        want = fly_verify_greedy(
            torch.tensor(d, dtype=torch.long), z, theta, w, top_k, boundary=boundary
        ).tokens.tolist()
        assert row(out, i) == want, i
    assert row(out, 0) == [3, 5, 7, 1, 2, 9, 4, 6, 8, 0]  # the deferred mismatch kept, then the bonus
    assert row(out, 1) == [10] and row(out, 2) == [1, 3] and row(out, 3) == [4, 4, 11]
    assert events["fly_deferred"] == 1 and events["fly_hard_rejects"] == 1 and events["fly_prefix_mismatches"] == 2


def test_gate_closed_is_vllms_exact_greedy_verification():
    reqs = make_requests()
    out, events = verify(reqs, FlySettings(fly_entropy_threshold=math.inf))
    for i, (d, z) in enumerate(reqs):
        assert row(out, i) == greedy_verify(torch.tensor(d, dtype=torch.long), z).tokens.tolist()
    assert row(out, 0) == [3, 4] and events["fly_deferred"] == 0


def test_gate_reads_the_raw_logits():
    """vLLM hands over temperature-scaled logits for sampled rows; the gate must see the raw ones."""
    reqs = [([3, 5, 7, 1, 2, 9, 4, 6, 8], logits_for([3, 4, 7, 1, 2, 9, 4, 6, 8, 0], flat={1}))]  # no noise
    draft_ids, num, cu, target, bonus = batch(reqs)
    sharpened = target * 50  # what a tiny temperature does: every row looks certain
    greedy = torch.tensor([True])
    out, _ = fly_rejection_sample(draft_ids, num, 9, cu, None, sharpened, bonus, greedy, FlySettings())
    assert row(out, 0) == [3, 4]
    out, _ = fly_rejection_sample(
        draft_ids, num, 9, cu, None, sharpened, bonus, greedy, FlySettings(), raw_logits=target
    )
    assert row(out, 0)[:2] == [3, 5]


def test_sampled_rows_match_the_engine_rule_with_the_same_draws():
    torch.manual_seed(0)
    k = 5
    d = torch.randint(0, V, (k,))
    z = torch.randn(k + 1, V)
    q = torch.softmax(torch.randn(k, V), -1)
    p = torch.softmax(z, -1)
    for seed in range(40):
        want = fly_verify_rejection(d, q, z, p, torch.Generator().manual_seed(seed), theta=0.3, window_size=3)
        # the same request twice in one batch, next to a greedy one, each with its own generator
        reqs = [(d.tolist(), z), (d.tolist(), z), ([1, 2], logits_for([1, 2, 3]))]
        draft_ids, num, cu, target, _ = batch(reqs)
        probs = torch.cat([q, q, torch.full((2, V), 1.0 / V)])
        bonus = torch.tensor([[int(want.tokens[-1])], [int(want.tokens[-1])], [3]])
        gens = {0: torch.Generator().manual_seed(seed), 1: torch.Generator().manual_seed(seed)}
        out, _ = fly_rejection_sample(
            draft_ids,
            num,
            k,
            cu,
            probs,
            target,
            bonus,
            torch.tensor([False, False, True]),
            FlySettings(fly_window_size=3, fly_sampling="rejection"),
            generators=gens,
        )
        assert row(out, 0) == want.tokens.tolist() == row(out, 1)
        assert row(out, 2) == [1, 2, 3]


def test_sampled_rows_use_the_draws_vllm_passes():
    k = 4
    d = torch.tensor([2, 2, 2, 2])
    z = torch.zeros(k, V)  # p uniform: p(d) = 1/12
    z_full = torch.cat([z, torch.zeros(1, V)])
    draft_ids, num, cu, target, bonus = batch([(d.tolist(), z_full)])
    gate_closed = FlySettings(fly_entropy_threshold=math.inf, fly_sampling="rejection")
    low = torch.full((k,), 0.01)  # u < p(d)/q(d) = 1/12 everywhere (n-gram: q one-hot)
    out, _ = fly_rejection_sample(
        draft_ids, num, k, cu, None, target, bonus, torch.tensor([False]), gate_closed, uniform_probs=low
    )
    assert row(out, 0)[:4] == [2, 2, 2, 2]
    high = torch.tensor([0.01, 0.9, 0.01, 0.01])
    out, _ = fly_rejection_sample(
        draft_ids, num, k, cu, None, target, bonus, torch.tensor([False]), gate_closed, uniform_probs=high
    )
    r = row(out, 0)
    assert r[0] == 2 and len(r) == 2 and r[1] != 2  # rejected at 1; the correction excludes the one-hot draft


def test_inconsistent_layout_is_an_error():
    reqs = make_requests()
    draft_ids, num, cu, target, bonus = batch(reqs)
    with pytest.raises(ValueError, match="request 0"):
        fly_rejection_sample(draft_ids, [8, 0, 3, 2], 9, cu, None, target, bonus, None, FlySettings())


def test_settings_from_environment():
    assert FlySettings.from_env({}) is None
    assert FlySettings.from_env({"LOOSESPEC_REJECTION_SAMPLE_METHOD": "standard"}) is None
    s = FlySettings.from_env(
        {
            "LOOSESPEC_REJECTION_SAMPLE_METHOD": "FLy",
            "LOOSESPEC_FLY_WINDOW_SIZE": "4",
            "LOOSESPEC_FLY_ENTROPY_THRESHOLD": "inf",
        }
    )
    assert s == FlySettings(fly_window_size=4, fly_entropy_threshold=math.inf)
    with pytest.raises(ValueError, match="'fly' or 'standard'"):
        FlySettings.from_env({"LOOSESPEC_REJECTION_SAMPLE_METHOD": "loose"})
    with pytest.raises(ValueError, match="FLY_WINDOW_SIZE must be an integer"):
        FlySettings.from_env({"LOOSESPEC_REJECTION_SAMPLE_METHOD": "fly", "LOOSESPEC_FLY_WINDOW_SIZE": "six"})
    with pytest.raises(ValueError, match="fly_entropy_top_k"):
        FlySettings(fly_entropy_top_k=0)


def v2_batch(requests, states, max_num_reqs=6, temperature=0.0, seed=7):
    """[(draft tokens, target logits [K+1, V])] in vLLM's V2 runner layout: every request owns K+1 logits rows,
    ``draft_sampled`` holds each row's input token (the last sampled token, then the drafts), requests sit at
    request-state slots ``states``."""
    rows, sampled, cu, pos = [], [], [0], []
    for d, z in requests:
        rows.append(z[: len(d) + 1])
        sampled += [0, *d]
        pos += list(range(100, 101 + len(d)))
        cu.append(cu[-1] + len(d) + 1)
    temps = torch.zeros(max_num_reqs)
    for r, st in enumerate(states):
        temps[st] = temperature[r] if isinstance(temperature, (list, tuple)) else temperature
    return dict(
        target_logits=torch.cat(rows),
        draft_sampled=torch.tensor(sampled),
        cu_num_logits=torch.tensor(cu),
        pos=torch.tensor(pos),
        idx_mapping=torch.tensor(states),
        temperature=temps,
        seed=torch.full((max_num_reqs,), seed),
    )


def verify_v2(b, settings, k=9, draft_logits=None, processed=None):
    target = b["target_logits"] if processed is None else processed
    return fly_rejection_sample_v2(
        target,
        b["target_logits"],
        draft_logits,
        b["draft_sampled"],
        b["cu_num_logits"],
        b["pos"],
        b["idx_mapping"],
        b["temperature"],
        b["seed"],
        k,
        settings,
    )


def v2_rows(sampled, num_sampled):
    return [sampled[i, : int(n)].tolist() for i, n in enumerate(num_sampled)]


def test_v2_layout_rules_as_v1_does():
    """The V2 runner's layout (bonus rows inline, requests at permuted state slots) gives the V1 result."""
    reqs = make_requests()
    for s in (FlySettings(), FlySettings(fly_entropy_threshold=math.inf)):
        v1, ev1 = verify(reqs, s)
        sampled, num, ev2 = verify_v2(v2_batch(reqs, states=[4, 0, 5, 2]), s)
        assert sampled.shape == (4, 10) and sampled.dtype == torch.int64 and num.dtype == torch.int32
        assert v2_rows(sampled, num) == [row(v1, i) for i in range(4)]
        assert ev1 == ev2


def test_v2_placeholder_drafts_are_rejected():
    """A -1 draft (V2 marks drafts of a request still in prefill so) ends the draft even where FLy would defer."""
    t = [3, 4, 7, 1, 2, 9, 4, 6, 8, 0]
    z = logits_for(t, flat={1})
    good, _, _ = verify_v2(v2_batch([([3, 5, 7, 1, 2, 9, 4, 6, 8], z)], [0]), FlySettings())
    assert good[0].tolist() == [3, 5, 7, 1, 2, 9, 4, 6, 8, 0]  # deferred, as in V1
    sampled, num, events = verify_v2(v2_batch([([3, -1, 7, 1, 2, 9, 4, 6, 8], z)], [0]), FlySettings())
    assert v2_rows(sampled, num) == [[3, 4]] and events["fly_prefix_mismatches"] == 0


def test_v2_sampled_requests_read_their_own_draft_logits():
    """draft_logits is indexed by request-state slot, pre-temperature: q == p accepts every draft (ratio 1);
    a draft the target gives ~0 probability is rejected at once."""
    g = torch.Generator().manual_seed(3)
    k, temp = 4, 0.7
    z_a = torch.randn(k + 1, V, generator=g)
    d_a = [1, 2, 3, 4]
    z_b = torch.randn(k + 1, V, generator=g)
    z_b[:, 5] = -30.0
    d_b = [5, 5, 5, 5]
    b = v2_batch([(d_a, z_a), (d_b, z_b)], states=[3, 0], temperature=temp)
    draft_logits = torch.full((6, k, V), 1.0)  # other slots: flat garbage
    draft_logits[3] = z_a[:k]  # request A's drafter agrees with the target exactly
    draft_logits[0] = torch.zeros(k, V)
    draft_logits[0, :, 5] = 30.0  # request B's drafter is sure of a token the target excludes
    processed = b["target_logits"] / temp
    gate_closed = FlySettings(fly_entropy_threshold=math.inf, fly_sampling="rejection")
    for seed in range(5):
        b["seed"] = torch.full((6,), seed)
        sampled, num, _ = verify_v2(b, gate_closed, k=k, draft_logits=draft_logits, processed=processed)
        a, bb = v2_rows(sampled, num)
        assert a[:k] == d_a and len(a) == k + 1
        assert len(bb) == 1 and bb[0] != 5
    again = verify_v2(b, gate_closed, k=k, draft_logits=draft_logits, processed=processed)
    assert torch.equal(again[0], sampled)  # a seeded request verifies the same way every time


@pytest.fixture
def fake_vllm(monkeypatch):
    """The names the plugin touches in vllm.v1.sample.rejection_sampler, as a stand-in module."""
    rs = types.ModuleType("vllm.v1.sample.rejection_sampler")
    rs.GREEDY_TEMPERATURE = 0
    rs.rejection_sample = lambda *a, **k: "vllm's own"
    rs.apply_sampling_constraints = lambda logits, cu, md: logits.div_(md.temperature[0])
    rs.generate_uniform_probs = lambda n, num, gens, device: torch.full((n,), 0.5)
    for name in ("vllm", "vllm.v1", "vllm.v1.sample"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.sample.rejection_sampler", rs)
    sys.modules["vllm.v1.sample"].rejection_sampler = rs
    return rs


def test_plugin_does_nothing_unless_enabled(fake_vllm, monkeypatch):
    from loosespec.integrations.vllm import plugin

    monkeypatch.delenv("LOOSESPEC_REJECTION_SAMPLE_METHOD", raising=False)
    plugin.register()
    assert fake_vllm.rejection_sample() == "vllm's own"


def test_plugin_replaces_verification_and_counts(fake_vllm, monkeypatch, tmp_path):
    from loosespec.integrations.vllm import plugin

    monkeypatch.setenv("LOOSESPEC_REJECTION_SAMPLE_METHOD", "fly")
    monkeypatch.setenv("LOOSESPEC_FLY_STATS_FILE", str(tmp_path / "fly-{pid}.json"))
    plugin.register()
    plugin.register()  # a second call in the same process leaves one layer of patching
    reqs = make_requests()
    draft_ids, num, cu, target, bonus = batch(reqs)
    md = types.SimpleNamespace(all_greedy=True, all_random=False, temperature=torch.tensor([0.0] * 4), generators={})
    out = fake_vllm.rejection_sample(draft_ids, num, 9, cu, None, target, bonus, md, synthetic_mode=False)
    assert row(out, 0) == [3, 5, 7, 1, 2, 9, 4, 6, 8, 0]
    # a mixed batch: the constraints wrapper keeps the raw logits for the gate
    md = types.SimpleNamespace(
        all_greedy=False, all_random=False, temperature=torch.tensor([0.0, 0.7, 0.0, 0.0]), generators={}
    )
    processed = fake_vllm.apply_sampling_constraints(
        target.clone(), cu, types.SimpleNamespace(all_greedy=False, temperature=torch.tensor([0.02]))
    )
    out = fake_vllm.rejection_sample(draft_ids, num, 9, cu, None, processed, bonus, md)
    assert row(out, 0) == [3, 5, 7, 1, 2, 9, 4, 6, 8, 0]  # deferred: the gate saw the raw, uncertain row
    files = list(tmp_path.glob("fly-*.json"))
    assert len(files) == 1
    import json
    import time

    # the second step came inside the write interval: the trailing write brings the file up to date
    deadline = time.monotonic() + 10
    while json.loads(files[0].read_text())["steps"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    counts = json.loads(files[0].read_text())
    assert counts["steps"] == 2 and counts["fly_deferred"] >= 1 and counts["drafted_tokens"] >= 14


def test_stats_file_is_rewritten_at_most_every_interval(monkeypatch, tmp_path):
    """The writer's throttle, on a fake clock: one write per interval however many steps, a trailing write for the
    steps inside it (scheduled once), and the file never more than an interval behind."""
    import json

    from loosespec.integrations.vllm import plugin

    clock = [100.0]
    timers = []
    monkeypatch.setattr(plugin, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(plugin, "_start_timer", lambda delay, fn: timers.append((delay, fn)), raising=False)
    path = tmp_path / "fly.json"
    counters = plugin.FlyCounters(str(path))
    out, num = torch.tensor([[4, 5, -1]]), torch.tensor([2])

    def steps_on_disk():
        return json.loads(path.read_text())["steps"]

    counters.add(out, num, {"fly_deferred": 1})
    assert steps_on_disk() == 1  # the first step is written at once
    for _ in range(5):  # inside the interval: not rewritten
        clock[0] += 0.05
        counters.add(out, num, {"fly_deferred": 1})
    assert steps_on_disk() == 1
    assert len(timers) == 1 and timers[0][0] == pytest.approx(0.45)  # one trailing write, at the interval's end
    clock[0] += 0.25
    timers.pop()[1]()
    assert steps_on_disk() == 6 and json.loads(path.read_text())["fly_deferred"] == 6
    clock[0] += 0.6  # past the interval: the next step writes at once
    counters.add(out, num, {})
    assert steps_on_disk() == 7 and not timers


def _unwritable_dir(tmp_path):
    """A directory this process cannot write: read-only, or (as root, who writes anyway) a regular file."""
    import os

    d = tmp_path / "read-only"
    d.mkdir()
    d.chmod(0o500)
    if os.access(d, os.W_OK):
        d = tmp_path / "a-file"
        d.write_text("")
    return d


def test_a_stats_file_that_cannot_be_written_never_stops_generation(fake_vllm, monkeypatch, tmp_path, caplog):
    """A failed write inside vLLM's sampler used to raise there and kill the engine: now it is logged once and the
    steps go on."""
    import logging

    from loosespec.integrations.vllm import plugin

    clock = [100.0]
    monkeypatch.setattr(plugin, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(plugin, "_start_timer", lambda delay, fn: None, raising=False)
    path = _unwritable_dir(tmp_path) / "fly.json"
    monkeypatch.setenv("LOOSESPEC_REJECTION_SAMPLE_METHOD", "fly")
    monkeypatch.setenv("LOOSESPEC_FLY_STATS_FILE", str(path))
    plugin.register()
    draft_ids, num, cu, target, bonus = batch(make_requests())
    md = types.SimpleNamespace(all_greedy=True, all_random=False, temperature=torch.tensor([0.0] * 4), generators={})
    with caplog.at_level(logging.WARNING, logger="loosespec.integrations.vllm"):
        for _ in range(3):
            clock[0] += 1.0  # each step past the interval: each tries to write
            out = fake_vllm.rejection_sample(draft_ids, num, 9, cu, None, target, bonus, md)
            assert row(out, 0) == [3, 5, 7, 1, 2, 9, 4, 6, 8, 0]
    warnings = [r for r in caplog.records if "cannot write FLy's counters" in r.getMessage()]
    assert len(warnings) == 1 and str(path) in warnings[0].getMessage()
    assert not path.exists()


@pytest.fixture
def fake_vllm_v2(fake_vllm, monkeypatch):
    """The V2 runner's RejectionSampler as a stand-in: the plugin wraps its ``_verify``."""
    mod = types.ModuleType("vllm.v1.worker.gpu.spec_decode.rejection_sampler")

    class RejectionSampler:
        def __init__(self, sampler, k):
            self.sampler, self.num_speculative_steps = sampler, k
            self.synthetic_conditional_rates, self.use_block_verification, self.watermark_key = None, False, None

        def _verify(
            self,
            logits,
            draft_logits,
            draft_sampled,
            pos,
            cu_num_logits,
            idx_mapping,
            idx_mapping_np,
            expanded_idx_mapping,
            expanded_local_pos,
            seq_lens_upper_bound_np,
            verify_draft_sampled,
        ):
            return "vllm's own"  # vLLM 0.32.0's parameters (another release has 10: Verify10 below)

    mod.RejectionSampler = RejectionSampler
    for name in ("vllm.v1.worker", "vllm.v1.worker.gpu", "vllm.v1.worker.gpu.spec_decode"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    sys.modules["vllm.v1.worker.gpu.spec_decode"].rejection_sampler = mod
    return mod


def test_plugin_wraps_the_v2_runner(fake_vllm_v2, monkeypatch, tmp_path):
    from loosespec.integrations.vllm import plugin

    monkeypatch.setenv("LOOSESPEC_REJECTION_SAMPLE_METHOD", "fly")
    monkeypatch.setenv("LOOSESPEC_FLY_STATS_FILE", str(tmp_path / "fly.json"))
    plugin.register()
    reqs = make_requests()
    b = v2_batch(reqs, states=[1, 0, 3, 2])
    temp = 0.02

    def apply_sampling_params(logits, *args):
        return logits / temp  # what a tiny temperature does: every row looks certain

    states = types.SimpleNamespace(
        temperature=types.SimpleNamespace(gpu=b["temperature"]), seeds=types.SimpleNamespace(gpu=b["seed"])
    )
    sampler = types.SimpleNamespace(apply_sampling_params=apply_sampling_params, sampling_states=states)
    rs = fake_vllm_v2.RejectionSampler(sampler, 9)
    processed, sampled, num = rs._verify(
        b["target_logits"],
        None,
        b["draft_sampled"],
        b["pos"],
        b["cu_num_logits"],
        b["idx_mapping"],
        b["idx_mapping"].numpy(),
        None,
        None,
        None,
        b["draft_sampled"],
    )
    assert torch.equal(processed, b["target_logits"] / temp)
    assert v2_rows(sampled, num)[0] == [3, 5, 7, 1, 2, 9, 4, 6, 8, 0]  # the gate read the raw logits
    import json

    counts = json.loads((tmp_path / "fly.json").read_text())
    assert counts["steps"] == 1 and counts["fly_deferred"] == 1 and counts["drafted_tokens"] == 14
    rs.use_block_verification = True
    with pytest.raises(RuntimeError, match="'block'"):
        rs._verify(
            b["target_logits"],
            None,
            b["draft_sampled"],
            b["pos"],
            b["cu_num_logits"],
            b["idx_mapping"],
            b["idx_mapping"].numpy(),
            None,
            None,
            None,
            b["draft_sampled"],
        )


def test_a_row_top_p_emptied_falls_back_to_the_raw_logits():
    """vLLM's start-up profiling verifies random logits under top-p 0.9 and can leave a row with no finite
    logit; the rule must draw from the unprocessed row instead of failing (V1 and V2 layouts)."""
    d = [2, 2]
    raw = logits_for([7, 7, 7])
    processed = raw.clone()
    processed[0] = -math.inf  # nothing left at the first position
    draft_ids, num, cu, _, bonus = batch([(d, raw)])
    q = torch.full((2, V), 1.0 / V)
    for seed in range(5):
        out, _ = fly_rejection_sample(
            draft_ids,
            num,
            2,
            cu,
            q,
            processed[:2],
            bonus,
            torch.tensor([False]),
            FlySettings(fly_entropy_threshold=math.inf, fly_sampling="rejection"),
            raw_logits=raw[:2],
            generators={0: torch.Generator().manual_seed(seed)},
        )
        assert row(out, 0) == [7]  # rejected (p(2) ~ 0 under the raw row), corrected from the raw row's mass
    b = v2_batch([(d, raw)], [0], temperature=1.0)
    sampled, num2, _ = fly_rejection_sample_v2(
        processed.flip(0),
        raw.flip(0),
        None,
        b["draft_sampled"],
        b["cu_num_logits"],
        b["pos"],
        b["idx_mapping"],
        b["temperature"],
        b["seed"],
        2,
        FlySettings(),
    )
    assert int(num2[0]) >= 1  # the last (bonus) row is the emptied one here: drawn from its raw row


def test_two_sample_variant_is_the_plugins_default_as_the_engines():
    """Same knob, same default: sampled requests match a draft token against two target draws (the official
    code's variant) and correct with the first draw, in the plugin as in the engine's FlyRule."""
    from loosespec.config import knob_default

    assert FlySettings().fly_sampling == knob_default("fly_sampling") == "two-sample"
    k = 4
    z = torch.full((k + 1, V), -30.0)
    z[:, 3] = 0.0  # the target puts all its mass on token 3 at every position
    settings = FlySettings(fly_entropy_threshold=math.inf)  # gate closed: only matches are kept
    # a draft of 3s: both draws are 3, everything kept; the bonus is vLLM's
    draft_ids, num, cu, target, bonus = batch([([3, 3, 3, 3], z)])
    out, _ = fly_rejection_sample(
        draft_ids,
        num,
        k,
        cu,
        None,
        target,
        bonus,
        torch.tensor([False]),
        settings,
        generators={0: torch.Generator().manual_seed(0)},
    )
    assert row(out, 0) == [3, 3, 3, 3, int(bonus[0, 0])]
    # a draft token the target never draws is rejected and corrected with the first draw (3)
    draft_ids, num, cu, target, bonus = batch([([3, 7, 3, 3], z)])
    out, _ = fly_rejection_sample(
        draft_ids,
        num,
        k,
        cu,
        None,
        target,
        bonus,
        torch.tensor([False]),
        settings,
        generators={0: torch.Generator().manual_seed(0)},
    )
    assert row(out, 0) == [3, 3]
    # the correction is the first of the two draws, drawn from the request's own generator
    torch.manual_seed(1)
    zz = torch.randn(k + 1, V)
    p = torch.softmax(zz, -1)
    d = p[:k].argmax(-1)
    for seed in range(10):
        g = torch.Generator().manual_seed(seed)
        first = torch.multinomial(p[:k], 1, generator=g).squeeze(-1)
        draft_ids, num, cu, target, bonus = batch([(d.tolist(), zz)])
        out, _ = fly_rejection_sample(
            draft_ids,
            num,
            k,
            cu,
            None,
            target,
            bonus,
            torch.tensor([False]),
            FlySettings(fly_window_size=2),
            generators={0: torch.Generator().manual_seed(seed)},
        )
        r = row(out, 0)
        n = len(r) - 1
        if n < k:  # a correction: the first of the two draws at that position
            assert r[n] == int(first[n])


def _v2_module(monkeypatch, sampler_cls):
    mod = types.ModuleType("vllm.v1.worker.gpu.spec_decode.rejection_sampler")
    mod.RejectionSampler = sampler_cls
    for name in ("vllm.v1.worker", "vllm.v1.worker.gpu", "vllm.v1.worker.gpu.spec_decode"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    sys.modules["vllm.v1.worker.gpu.spec_decode"].rejection_sampler = mod
    return mod


class _V2Base:
    """What the wrapper reads of a V2 RejectionSampler instance (vLLM's constructor sets these)."""

    def __init__(self, sampler, k):
        self.sampler, self.num_speculative_steps = sampler, k
        self.synthetic_conditional_rates, self.use_block_verification, self.watermark_key = None, False, None

    def __call__(self, logits, b):  # as vLLM's: draft_sampled and pos from the batch, then _verify_in_chunks
        return self._verify_in_chunks(logits, b)


class Verify10(_V2Base):
    """A vLLM release whose _verify takes 10 parameters (no verify_draft_sampled)."""

    def _verify(
        self,
        logits,
        draft_logits,
        draft_sampled,
        pos,
        cu_num_logits,
        idx_mapping,
        idx_mapping_np,
        expanded_idx_mapping,
        expanded_local_pos,
        seq_lens_upper_bound_np,
    ):
        raise AssertionError("vLLM's own _verify ran")

    def _verify_in_chunks(self, logits, b):
        return self._verify(
            logits,
            None,
            b["draft_sampled"],
            b["pos"],
            b["cu_num_logits"],
            b["idx_mapping"],
            b["idx_mapping"].numpy(),
            None,
            None,
            None,
        )


class Verify11(Verify10):
    """Another release: 11 parameters, the tokens to verify in ``verify_draft_sampled``, passed by keyword."""

    def _verify(
        self,
        logits,
        draft_logits,
        draft_sampled,
        pos,
        cu_num_logits,
        idx_mapping,
        idx_mapping_np,
        expanded_idx_mapping,
        expanded_local_pos,
        seq_lens_upper_bound_np,
        verify_draft_sampled,
    ):
        raise AssertionError("vLLM's own _verify ran")

    def _verify_in_chunks(self, logits, b):
        return self._verify(
            logits=logits,
            draft_logits=None,
            draft_sampled=torch.zeros_like(b["draft_sampled"]),
            pos=b["pos"],
            cu_num_logits=b["cu_num_logits"],
            idx_mapping=b["idx_mapping"],
            idx_mapping_np=None,
            expanded_idx_mapping=None,
            expanded_local_pos=None,
            seq_lens_upper_bound_np=None,
            verify_draft_sampled=b["draft_sampled"],
        )


class GraphedCall(Verify10):
    """A release whose __call__ runs a CUDA-graphed sampler and never reaches _verify."""

    def __call__(self, logits, b):
        return self._run_cuda_graph(logits, b)

    def _run_cuda_graph(self, logits, b):
        return "vllm's own"


class SometimesGraphed(Verify10):
    """The graphed path chosen at run time: refused at the first step that takes it."""

    use_graph = False

    def __call__(self, logits, b):
        return self._replay(logits) if self.use_graph else self._verify_in_chunks(logits, b)

    def _replay(self, logits):
        return "vllm's own"


def _v2_sampler(b, cls, apply=None):
    states = types.SimpleNamespace(
        temperature=types.SimpleNamespace(gpu=b["temperature"]), seeds=types.SimpleNamespace(gpu=b["seed"])
    )

    def apply_sampling_params(
        logits, expanded_idx_mapping, idx_mapping_np, pos, input_ids, expanded_local_pos, skip_top_k_top_p=False
    ):  # another release's names: input_ids for draft_sampled
        assert torch.equal(input_ids, torch.zeros_like(input_ids)) or input_ids.shape == pos.shape
        return logits

    sampler = types.SimpleNamespace(apply_sampling_params=apply or apply_sampling_params, sampling_states=states)
    return cls(sampler, 9)


@pytest.mark.parametrize("cls", [Verify10, Verify11])
def test_plugin_binds_v2_arguments_by_name(fake_vllm, monkeypatch, tmp_path, cls):
    """vLLM releases differ in _verify's parameters (10 or 11) and in apply_sampling_params' names; the wrapper
    binds both by name, so FLy rules either (and FLy defers the uncertain mismatch of request 0)."""
    from loosespec.integrations.vllm import plugin

    monkeypatch.setenv("LOOSESPEC_REJECTION_SAMPLE_METHOD", "fly")
    monkeypatch.setenv("LOOSESPEC_FLY_STATS_FILE", str(tmp_path / "fly.json"))
    mod = _v2_module(monkeypatch, type(cls.__name__, (cls,), {}))  # a fresh class: patching stays per test
    plugin.register()
    reqs = make_requests()
    b = v2_batch(reqs, states=[1, 0, 3, 2])
    rs = _v2_sampler(b, mod.RejectionSampler)
    processed, sampled, num = rs(b["target_logits"], b)
    assert v2_rows(sampled, num)[0] == [3, 5, 7, 1, 2, 9, 4, 6, 8, 0]
    v1, _ = verify(reqs, FlySettings())
    assert v2_rows(sampled, num) == [row(v1, i) for i in range(4)]
    import json

    counts = json.loads((tmp_path / "fly.json").read_text())
    assert counts["fly_deferred"] == 1 and counts["drafted_tokens"] == 14


def test_plugin_refuses_a_sampler_apply_it_cannot_feed(fake_vllm, monkeypatch):
    from loosespec.integrations.vllm import plugin

    monkeypatch.setenv("LOOSESPEC_REJECTION_SAMPLE_METHOD", "fly")
    mod = _v2_module(monkeypatch, type("V", (Verify10,), {}))
    plugin.register()
    b = v2_batch(make_requests(), states=[1, 0, 3, 2])
    rs = _v2_sampler(b, mod.RejectionSampler, apply=lambda logits, unheard_of: logits)
    with pytest.raises(plugin.V2Unsupported, match="unheard_of"):
        rs(b["target_logits"], b)


def test_plugin_refuses_a_graphed_v2_sampler_at_register(fake_vllm, monkeypatch):
    """A __call__ that never reaches _verify (a CUDA-graphed fast path) would turn FLy off silently: register()
    refuses it, naming the path."""
    from loosespec.integrations.vllm import plugin

    monkeypatch.setenv("LOOSESPEC_REJECTION_SAMPLE_METHOD", "fly")
    _v2_module(monkeypatch, type("G", (GraphedCall,), {}))
    with pytest.raises(plugin.V2Unsupported, match="never calls _verify.*_run_cuda_graph"):
        plugin.register()


def test_plugin_refuses_a_step_that_bypasses_verify(fake_vllm, monkeypatch):
    """A graphed path taken only at run time: the first step that bypasses _verify raises instead of serving
    vLLM's own verification under FLy's name."""
    from loosespec.integrations.vllm import plugin

    monkeypatch.setenv("LOOSESPEC_REJECTION_SAMPLE_METHOD", "fly")
    mod = _v2_module(monkeypatch, type("S", (SometimesGraphed,), {}))
    plugin.register()
    b = v2_batch(make_requests(), states=[1, 0, 3, 2])
    rs = _v2_sampler(b, mod.RejectionSampler)
    rs(b["target_logits"], b)  # through _verify: fine
    rs.use_graph = True
    with pytest.raises(plugin.V2Unsupported, match="without calling _verify"):
        rs(b["target_logits"], b)


def test_plugin_refuses_a_verify_without_the_names_it_reads(fake_vllm, monkeypatch):
    from loosespec.integrations.vllm import plugin

    class Renamed(_V2Base):
        def _verify(self, target_logits, draft_logits, draft_sampled, pos, cu_num_logits, idx_mapping):
            pass

        def __call__(self, logits, b):
            return self._verify(logits, None, None, None, None, None)

    monkeypatch.setenv("LOOSESPEC_REJECTION_SAMPLE_METHOD", "fly")
    _v2_module(monkeypatch, Renamed)
    with pytest.raises(plugin.V2Unsupported, match=r"lacks \['logits'\]"):
        plugin.register()


def _random_v2_batch(g, requests, k, vocab=V):
    lens = torch.randint(0, k + 1, (requests,), generator=g)
    rows = int((lens + 1).sum())
    cu = torch.cat([torch.zeros(1, dtype=torch.long), (lens + 1).cumsum(0)])
    raw = torch.randn(rows, vocab, generator=g)
    hot = torch.randint(0, vocab, (rows,), generator=g)
    raw[torch.arange(rows), hot] += torch.where(torch.rand(rows, generator=g) < 0.6, 8.0, 0.4)  # some uncertain
    sampled = torch.zeros(rows, dtype=torch.long)
    for r in range(requests):
        lo, n = int(cu[r]), int(lens[r])
        d = hot[lo : lo + n].clone()
        flip = torch.rand(n, generator=g) < 0.2
        d[flip] = torch.randint(0, vocab, (int(flip.sum()),), generator=g)
        if n and float(torch.rand(1, generator=g)) < 0.15:  # a request still in prefill: placeholders from j on
            d[int(torch.randint(0, n, (1,), generator=g)) :] = -1
        sampled[lo + 1 : lo + 1 + n] = d
    return raw, sampled, cu, torch.arange(rows), torch.randperm(requests, generator=g)


def test_v2_greedy_batches_rule_vectorized_as_per_request():
    """An all-greedy V2 batch is ruled on the padded [batch, K] layout without a per-request loop (issue 22, 8):
    the same tokens, counts and counters as the per-request path, over random batches with drafts of every
    length, placeholders and settings that make every FLy condition decide somewhere."""
    g = torch.Generator().manual_seed(5)
    for trial in range(60):
        k = int(torch.randint(1, 16, (1,), generator=g))
        requests = int(torch.randint(1, 12, (1,), generator=g))
        raw, sampled, cu, pos, idx = _random_v2_batch(g, requests, k)
        settings = FlySettings(
            fly_window_size=int(torch.randint(0, min(k, 6), (1,), generator=g)),
            fly_entropy_threshold=[0.0, 0.3, 0.6, math.inf][trial % 4],
            fly_boundary=["window", "official"][trial % 3 == 0],
        )
        temps = torch.zeros(requests + 3)
        args = (raw, raw, None, sampled, cu, pos, idx, temps, torch.zeros(requests + 3, dtype=torch.long), k, settings)
        fast = fly_rejection_sample_v2(*args)
        slow = fly_rejection_sample_v2(*args, vectorized=False)
        assert torch.equal(fast[0], slow[0]) and fast[0].dtype == slow[0].dtype, trial
        assert torch.equal(fast[1], slow[1]) and fast[1].dtype == torch.int32, trial
        assert fast[2] == slow[2], trial


# --- the V2 batch's sampled requests on the padded layout (issue 22, 8; opt-in: sampled_path="padded") ---------


def test_counter_uniform_is_uniform_keyed_and_stateless():
    from scipy.stats import kstest

    from loosespec.integrations.vllm.rule import counter_uniform

    pos = torch.arange(200_000)
    u = counter_uniform(torch.full_like(pos, 7), pos, 0)
    assert u.dtype == torch.float64 and bool(((u > 0) & (u < 1)).all())
    assert kstest(u.numpy(), "uniform").pvalue > 1e-3
    assert torch.equal(u, counter_uniform(torch.full_like(pos, 7), pos, 0))  # no state: the same key, the same u
    for other in (
        counter_uniform(torch.full_like(pos, 8), pos, 0),
        counter_uniform(torch.full_like(pos, 7), pos, 1),
        counter_uniform(torch.full_like(pos, 7 + 2**40), pos, 0),
    ):  # seed, stream, the seed's high bits
        assert float((other == u).double().mean()) < 1e-3
    big = counter_uniform(torch.tensor([2**63 - 1, -5]), torch.tensor([2**40, 3]), 2)  # no overflow at the ends
    assert bool(((big > 0) & (big < 1)).all())


def test_v2_padded_sampled_path_rules_greedy_requests_as_per_request():
    """Mixed batches on the padded layout: each greedy request gets exactly the per-request path's row (its draws
    are the argmax), over random batches, drafts of every length, placeholders, both sampling variants."""
    g = torch.Generator().manual_seed(8)
    for trial in range(40):
        k = int(torch.randint(1, 16, (1,), generator=g))
        requests = int(torch.randint(2, 12, (1,), generator=g))
        raw, sampled, cu, pos, idx = _random_v2_batch(g, requests, k)
        settings = FlySettings(
            fly_window_size=int(torch.randint(0, min(k, 6), (1,), generator=g)),
            fly_entropy_threshold=[0.0, 0.3, 0.6, math.inf][trial % 4],
            fly_sampling=["two-sample", "rejection"][trial % 2],
            fly_boundary=["window", "official"][trial % 3 == 0],
        )
        temps = torch.where(torch.rand(requests + 3, generator=g) < 0.5, 0.0, 0.7)
        temps[idx[0]] = 0.7  # at least one sampled request: the padded path's own part runs
        args = (raw / 0.7, raw, None, sampled, cu, pos, idx, temps, torch.arange(requests + 3), k, settings)
        fast, fast_n, _ = fly_rejection_sample_v2(*args, sampled_path="padded")
        slow, slow_n, _ = fly_rejection_sample_v2(*args)
        for r in range(requests):
            n = int(fast_n[r])
            assert 1 <= n <= int(cu[r + 1] - cu[r]) and bool((fast[r, n:] == -1).all()), trial
            if temps[idx[r]] == 0:
                assert torch.equal(fast[r], slow[r]) and n == int(slow_n[r]), (trial, r)


def _same_request_batch(requests, drafts, target, raw, temp, draft_logits=None):
    """``requests`` requests with the same logits (processed and raw, [k + 1, V]), each with its own drafts
    (``drafts`` [requests, k]) and seed."""
    k = drafts.shape[1]
    cu = torch.arange(requests + 1) * (k + 1)
    sampled = torch.cat([torch.zeros(requests, 1, dtype=torch.long), drafts], 1).reshape(-1)
    return (
        target.repeat(requests, 1),
        raw.repeat(requests, 1),
        draft_logits,
        sampled,
        cu,
        torch.arange(k + 1).repeat(requests) + 100,
        torch.arange(requests),
        torch.full((requests,), temp),
        torch.arange(requests) * 7919 + 3,
    )


@pytest.mark.parametrize("proposal", ["one-hot", "draft-distribution"])
def test_v2_padded_rejection_with_the_gate_closed_emits_the_targets_distribution(proposal):
    """FLy's rejection variant with the gate closed is lossless rejection sampling: over many seeds, the first
    token the padded path emits is distributed as the target's p at that position (chi-square), for an n-gram
    proposal (one-hot q) and for drafts sampled from a draft distribution q (the residual correction runs)."""
    from scipy.stats import chisquare

    g = torch.Generator().manual_seed(3)
    vocab, k, requests, temp = 6, 2, 6000, 0.7
    raw = torch.randn(k + 1, vocab, generator=g) * 1.5
    target = raw / temp
    p0 = target[0].softmax(-1)
    draft_logits = None
    if proposal == "one-hot":
        drafts = torch.tensor([[int(p0.argmin()), 1]]).repeat(requests, 1)  # a poor first draft: corrections run
    else:
        z = torch.randn(k, vocab, generator=g) * 1.5
        q = (z / temp).softmax(-1)
        drafts = torch.stack([torch.multinomial(q[j], requests, replacement=True, generator=g) for j in range(k)], 1)
        draft_logits = z.repeat(requests, 1, 1)
    settings = FlySettings(fly_entropy_threshold=math.inf, fly_sampling="rejection")
    out, num, events = fly_rejection_sample_v2(
        *_same_request_batch(requests, drafts, target, raw, temp, draft_logits), k, settings, sampled_path="padded"
    )
    first = out[:, 0]
    assert bool((first >= 0).all()) and events["fly_deferred"] == 0
    seen = torch.bincount(first, minlength=vocab).double()
    assert chisquare(seen.numpy(), (p0.double() * requests).numpy()).pvalue > 1e-3


def test_v2_padded_sampled_path_is_seeded_and_defers():
    """The counter-based draws make a seeded request verify the same way every time; requests at different seeds
    differ; with the gate open FLy defers on the padded path, and a bad path name is refused."""
    g = torch.Generator().manual_seed(4)
    vocab, k, requests = 8, 6, 64
    raw = torch.randn(k + 1, vocab, generator=g) * 0.3  # uncertain everywhere: the gate opens
    drafts = raw[:k].argmax(-1).repeat(requests, 1)
    drafts[:, 0] = (drafts[:, 0] + 1) % vocab  # a mismatch the window may excuse
    for variant in ("two-sample", "rejection"):
        batch = _same_request_batch(requests, drafts, raw / 0.7, raw, 0.7)
        settings = FlySettings(fly_entropy_threshold=0.0, fly_window_size=2, fly_sampling=variant)
        a = fly_rejection_sample_v2(*batch, k, settings, sampled_path="padded")
        b = fly_rejection_sample_v2(*batch, k, settings, sampled_path="padded")
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2]
        assert len({tuple(row.tolist()) for row in a[0]}) > 1  # seeds differ, draws differ
        assert a[2]["fly_deferred"] > 0
    with pytest.raises(ValueError, match="sampled_path"):
        fly_rejection_sample_v2(*batch, k, settings, sampled_path="fused")


def test_plugin_reads_the_v2_sampled_path(fake_vllm, monkeypatch):
    from loosespec.integrations.vllm import plugin

    assert plugin.v2_sampled_path({}) == "per-request"
    assert plugin.v2_sampled_path({"LOOSESPEC_V2_SAMPLED_PATH": " Padded "}) == "padded"
    monkeypatch.setenv("LOOSESPEC_REJECTION_SAMPLE_METHOD", "fly")
    monkeypatch.setenv("LOOSESPEC_V2_SAMPLED_PATH", "fused")
    with pytest.raises(ValueError, match="LOOSESPEC_V2_SAMPLED_PATH must be"):
        plugin.register()


def test_plugin_settings_mean_what_vllms_native_fly_means():
    """Unset, the plugin's FLy is vLLM's native default (theta 0.3, W = min(6, K - 1) positions after the
    mismatch, the window boundary); a window that cannot fit the draft is refused, as vLLM refuses it."""
    assert resolve(FlySettings(), 15) == (0.3, 6, 3, "window")
    assert resolve(FlySettings(), 4) == (0.3, 3, 3, "window")
    assert resolve(FlySettings(fly_window_size=5, fly_boundary="official"), 15) == (0.3, 5, 3, "official")
    with pytest.raises(ValueError, match="smaller than num_speculative_tokens"):
        resolve(FlySettings(fly_window_size=4), 4)
