"""FLy conformance, three ways on the same inputs: loosespec's rule (:mod:`loosespec.verify.fly`, and its vLLM-layout
adapter :func:`loosespec.integrations.vllm.rule.fly_rejection_sample`) against independent transcriptions of the
official FLy code's rule and of vLLM's native FLy (``tests/fakes/fly_reference.py``, which cites the files and
commits read). vLLM's own sampler is checked in its environment by tests/integrations/test_vllm_native_fly.py.

The window parameter is mapped explicitly: loosespec's and vLLM's ``fly_window_size`` W counts the positions after
a mismatch, the official code's ``win_len`` counts the mismatch too, so ``win_len = W + 1``; the official code's
deferral boundary is loosespec's ``fly_boundary="official"``, vLLM's is ``"window"`` (loosespec's default).

Greedy: identical emitted tokens and accepted counts on hand-built cases and on seeded random batches.
Sampled: the same distribution of (accepted count, next token), by a chi-square test of homogeneity, with a
check that the same test rejects a rule whose window is off by one (so agreement is not the test's blindness).

Differences found, each pinned below by the case that shows it (and listed in docs/vllm.md):

1. **Boundary** (by design, a knob): a mismatch at ``j = k - W - 1`` (its window ends at the draft's last token)
   is deferred by vLLM and loosespec's default boundary, rejected by the official code (``j <= k - W - 2``).
2. **theta in (0, 0.01]**: the official code turns its gate off, vLLM gates at that value, loosespec refuses it.
3. **Official counter**: the official ``total_fly_accepted`` counts the mismatches window and boundary would keep
   *before* the gate is applied; loosespec's ``fly_window_rescues`` counts those that gate, window and boundary keep
   (what is actually deferred). Equal when the gate is off (theta 0).
4. **Drafts shorter than the nominal K** with ``fly_boundary="official"``: loosespec bounds at
   ``min(K - W - 2, k - W - 1)``, the official code (which always drafts K) would bound a k-token draft at
   ``k - W - 2``.
5. **A draft token the target masks** (logit -inf: structured output, bad words): vLLM never defers to it;
   loosespec's rule and the official code do (the plugin inherits this).
6. **The gate's distribution at T > 0**: vLLM's native gate reads the processed distribution (after temperature,
   top-k, top-p), loosespec (engine and plugin) and the official code the raw logits; equal at T = 1 with no
   top-k/top-p.
7. **W = 0**: loosespec and the official code (``win_len = 1``) defer every gate-open mismatch inside the
   boundary; vLLM's native FLy needs ``fly_window_size >= 1``.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from fakes.fly_reference import (
    THETAS,
    V,
    logits_for,
    official_accept,
    official_entropy,
    official_greedy,
    official_two_sample,
    random_round,
    vllm_entropy,
    vllm_native_greedy,
    vllm_native_sampled,
)
from scipy.stats import chi2_contingency

from loosespec.integrations.vllm.native import native_fly_config
from loosespec.integrations.vllm.rule import FlySettings, fly_rejection_sample
from loosespec.verify.fly import (
    fly_events,
    fly_verify_greedy,
    fly_verify_rejection,
    fly_verify_two_sample,
    topk_entropy,
)

RANDOM_BATCHES = 400


@pytest.fixture(autouse=True)
def one_thread():
    """Thousands of tiny rounds: torch's thread pool only adds wake-ups (tens of times slower on a busy 2-core
    machine), so these tests run on one thread and give the count back after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def ours(draft, z, theta, w, boundary, nominal=None):
    v = fly_verify_greedy(
        torch.tensor(draft), z, theta=theta, window_size=w, num_draft_tokens=nominal, boundary=boundary
    )
    return v.tokens.tolist()


def case(target, draft, flat=(), masked=None):
    """A hand-built round: target tokens [k + 1] (the last is the bonus), the draft [k]."""
    return list(draft), logits_for(list(target), flat=flat, masked=masked)


T8 = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # target's choices for K = 8, then the bonus


def with_misses(*at):
    d = T8[:8].copy()
    for j in at:
        d[j] = 0
    return d


# (name, draft, target logits, theta, W) -> kept tokens under: official code / loosespec official boundary,
# vLLM native / loosespec window boundary
HAND_BUILT = [
    (
        "boundary: window ends at the draft's last token (j = k - W - 1)",
        *case(T8, with_misses(5), flat={5}),
        0.3,
        2,
        5,
        8,
    ),
    ("boundary: one position earlier (j = k - W - 2)", *case(T8, with_misses(4), flat={4}), 0.3, 2, 8, 8),
    ("gate closed: a confident mismatch", *case(T8, with_misses(1)), 0.3, 2, 1, 1),
    ("window broken at its last position", *case(T8, with_misses(1, 3), flat={1}), 0.3, 2, 1, 1),
    ("window broken at its first position", *case(T8, with_misses(1, 2), flat={1, 2}), 0.3, 2, 1, 1),
    ("theta 0: the gate is open even where the target is sure", *case(T8, with_misses(1)), 0.0, 2, 8, 8),
    ("two deferrals, windows apart", *case(T8, with_misses(0, 3), flat={0, 3}), 0.3, 2, 8, 8),
    ("a window longer than the draft allows", *case(T8, with_misses(2), flat={2}), 0.3, 6, 2, 2),
    ("no mismatch: the bonus", *case(T8, T8[:8]), 0.3, 2, 8, 8),
    ("mismatch at 0 with W = K - 1", *case(T8, with_misses(0), flat={0}), 0.3, 7, 0, 8),
]


@pytest.mark.parametrize("name,draft,z,theta,w,kept_official,kept_window", HAND_BUILT, ids=[c[0] for c in HAND_BUILT])
def test_hand_built_rounds_three_ways(name, draft, z, theta, w, kept_official, kept_window):
    want_official = draft[:kept_official] + [T8[kept_official]] if kept_official < 8 else draft + [T8[8]]
    want_window = draft[:kept_window] + [T8[kept_window]] if kept_window < 8 else draft + [T8[8]]
    official, _ = official_greedy(draft, z, theta, w + 1)
    assert official == want_official, "the transcription of the official code"
    assert ours(draft, z, theta, w, "official") == official
    assert vllm_native_greedy(draft, z, theta, w) == want_window, "the transcription of vLLM's native FLy"
    assert ours(draft, z, theta, w, "window") == want_window
    # and through the vLLM-layout adapter the plugin uses (a batch of one)
    out, _ = fly_rejection_sample(
        torch.tensor(draft),
        [8],
        8,
        torch.tensor([8]),
        None,
        z[:8],
        z[8].argmax().view(1, 1),
        None,
        FlySettings(fly_window_size=w, fly_entropy_threshold=theta),
    )
    assert [t for t in out[0].tolist() if t != -1] == want_window


def test_w_zero_defers_every_gate_open_mismatch_but_vllm_has_no_w_zero():
    """Difference 7: W = 0 (official win_len 1) keeps a gate-open mismatch anywhere inside the boundary; vLLM's
    native FLy needs fly_window_size >= 1, and loosespec refuses to ask it for 0."""
    draft, z = case(T8, with_misses(6, 7), flat={6, 7})
    official, _ = official_greedy(draft, z, 0.3, 1)
    assert official == ours(draft, z, 0.3, 0, "official") == draft[:7] + [T8[7]]  # 6 kept, 7 past the boundary
    assert ours(draft, z, 0.3, 0, "window") == draft + [T8[8]]  # window boundary: j + 0 < 8 everywhere
    with pytest.raises(AssertionError, match=">= 1"):
        vllm_native_greedy(draft, z, 0.3, 0)
    with pytest.raises(ValueError, match="fly_window_size >= 1"):
        native_fly_config({"fly_window_size": 0}, 15)


@pytest.mark.parametrize("theta", [0.005, 0.01])
def test_theta_in_the_official_off_range(theta):
    """Difference 2: a theta in (0, 0.01] turns the official gate off and vLLM gates at it; loosespec refuses it.
    A very confident mismatch (entropy below theta) with a clear window shows the two others disagree."""
    draft = with_misses(1)
    z = logits_for(T8)
    z[1, 2] = 20.0  # the target is all but sure of 2 at position 1: entropy ~ 1e-7
    assert official_entropy(z[1:2])[0] < theta
    official, _ = official_greedy(draft, z, theta, 3)
    assert official == draft + [T8[8]]  # gate off: deferred
    assert vllm_native_greedy(draft, z, theta, 2) == draft[:1] + [2]  # gated: rejected, the target's 2
    with pytest.raises(ValueError, match="ambiguous"):
        ours(draft, z, theta, 2, "official")


def test_official_window_counter_counts_before_the_gate():
    """Difference 3: a mismatch whose window is clear but whose gate is closed counts in the official
    total_fly_accepted, not in loosespec's fly_window_rescues (nor is it deferred by either)."""
    draft = with_misses(1)
    z = logits_for(T8)  # every row confident: the gate is closed at the mismatch
    match = [d == t for d, t in zip(draft, T8)]
    accepted, counters = official_accept(match, official_entropy(z[:8]), 0.3, 3)
    assert accepted[1] is False and counters == {"total_initial_mismatch": 1, "total_fly_accepted": 1}
    events = fly_events(torch.tensor(match), topk_entropy(z[:8]), 0.3, 2, torch.tensor(accepted), boundary="official")
    assert events["fly_initial_mismatches"] == 1 and events["fly_window_rescues"] == 0
    # gate off (theta 0): the two counters are equal
    _, counters = official_accept(match, official_entropy(z[:8]), 0.0, 3)
    events = fly_events(
        torch.tensor(match), topk_entropy(z[:8]), 0.0, 2, torch.ones(8, dtype=torch.bool), boundary="official"
    )
    assert counters["total_fly_accepted"] == events["fly_window_rescues"] == 1


def test_short_draft_under_the_official_boundary():
    """Difference 4: a draft cut to k = 6 of a nominal K = 8 (loosespec's cost-aware length, an end token): with
    the official boundary loosespec bounds at min(K - W - 2, k - W - 1) = 3, the official code, run on that
    6-token draft, at k - W - 2 = 2. (The official code drafts K every round, so it never meets this case.)"""
    draft = with_misses(3)[:6]
    z = logits_for(T8[:7], flat={3})
    official, _ = official_greedy(draft, z, 0.3, 3)
    assert official == draft[:3] + [T8[3]]
    assert ours(draft, z, 0.3, 2, "official", nominal=8) == draft + [T8[6]]
    assert ours(draft, z, 0.3, 2, "official") == official  # nominal = the draft's own length: the same


def test_a_masked_draft_token_is_never_deferred_to_by_vllm():
    """Difference 5: the target's logit for the draft token is -inf (a logits processor masked it); gate open,
    window clear. vLLM's native FLy keeps the target's choice; loosespec's rule and the official code defer."""
    draft = with_misses(2)
    z = logits_for(T8, flat={2}, masked={2: 0})
    assert vllm_native_greedy(draft, z, 0.3, 2) == draft[:2] + [T8[2]]
    official, _ = official_greedy(draft, z, 0.3, 3)
    assert official == ours(draft, z, 0.3, 2, "official") == ours(draft, z, 0.3, 2, "window") == draft + [T8[8]]


def test_gate_distribution_at_a_temperature():
    """Difference 6: at T = 0.25 a row the raw logits call uncertain (open gate at 0.3) is confident after
    temperature, so vLLM's native gate (processed probabilities) closes where loosespec's and the official code's
    (raw logits) open; at T = 1 the three read the same entropy."""
    z = torch.zeros(1, V)
    z[0, :3] = torch.tensor([2.0, 1.0, 0.5])
    raw = float(topk_entropy(z)[0])
    assert raw == pytest.approx(official_entropy(z)[0], abs=1e-6)
    assert raw == pytest.approx(vllm_entropy(z)[0], abs=1e-6)
    processed = vllm_entropy(torch.softmax(z / 0.25, -1), probs=True)[0]
    assert raw >= 0.3 > processed
    assert vllm_entropy(torch.softmax(z, -1), probs=True)[0] == pytest.approx(raw, abs=1e-6)


def test_random_batches_three_ways():
    """>= 300 seeded random batches of 1-6 requests (k in 0..K), K in 2..15, W in [1, min(K, 7)), theta over THETAS
    (inf: gate closed): loosespec's rule == the official transcription (official boundary, win_len = W + 1)
    request by request, loosespec's vLLM-layout adapter == the vLLM transcription (window boundary) on the whole
    batch, and the official and vLLM rules differ only where the boundary (difference 1) decides."""
    g = torch.Generator().manual_seed(46)
    rounds = deferred = boundary_cases = counter_gaps = 0
    for _ in range(RANDOM_BATCHES):
        big_k = int(torch.randint(2, 16, (1,), generator=g))
        w = int(torch.randint(1, min(big_k, 7), (1,), generator=g))  # 1 .. min(K - 1, 6): vLLM's default at most
        theta = THETAS[int(torch.randint(0, len(THETAS), (1,), generator=g))]
        requests = []
        for _ in range(int(torch.randint(1, 7, (1,), generator=g))):
            k = int(torch.randint(0, big_k + 1, (1,), generator=g))
            requests.append(random_round(g, k, theta))
        for draft, z in requests:
            rounds += 1
            official, counters = official_greedy(draft, z, theta, w + 1)
            mine = fly_verify_greedy(
                torch.tensor(draft, dtype=torch.long), z, theta=theta, window_size=w, boundary="official"
            )
            assert mine.tokens.tolist() == official, (draft, theta, w)
            assert mine.num_accepted == len(official) - 1
            if draft:  # counters over all k positions (the official code's)
                ev = mine.events
                assert ev["fly_initial_mismatches"] == counters["total_initial_mismatch"]
                assert ev["fly_window_rescues"] <= counters["total_fly_accepted"]
                counter_gaps += ev["fly_window_rescues"] < counters["total_fly_accepted"]
                if theta == 0.0:
                    assert ev["fly_window_rescues"] == counters["total_fly_accepted"]
            native = vllm_native_greedy(draft, z, theta, w)
            if native != official:  # only the boundary separates them: the official code rejects at
                boundary_cases += 1  # j = k - W - 1, vLLM defers there and keeps the whole draft
                k = len(draft)
                assert len(official) - 1 == k - w - 1 and official[:-1] == draft[: k - w - 1], (draft, w, official)
                assert native == draft + [int(z[k].argmax())], (draft, w, native)
            deferred += len(native) - 1 > first_exact(draft, z)
        # the batch through the adapter the plugin uses, against vLLM's rule request by request
        drafts = [torch.tensor(d, dtype=torch.long) for d, _ in requests]
        num = [len(d) for d in drafts]
        out, _ = fly_rejection_sample(
            torch.cat(drafts),
            num,
            big_k,
            torch.tensor(num).cumsum(0),
            None,
            torch.cat([z[: len(d)] for d, z in requests]),
            torch.stack([z[len(d)].argmax() for d, z in requests]).view(-1, 1),
            None,
            FlySettings(fly_window_size=w, fly_entropy_threshold=theta),
        )
        for i, (draft, z) in enumerate(requests):
            assert [t for t in out[i].tolist() if t != -1] == vllm_native_greedy(draft, z, theta, w), (draft, w)
    print(
        f"\nFLy conformance, greedy: {RANDOM_BATCHES} batches, {rounds} rounds: loosespec == official (official "
        f"boundary) and loosespec == vLLM (window boundary) on all; {deferred} rounds deferred at least once; "
        f"official vs vLLM differ on {boundary_cases} rounds, each by the boundary alone; the official window "
        f"counter exceeds loosespec's (gate-closed rescues) on {counter_gaps}"
    )
    assert rounds >= 300 and deferred >= 100 and boundary_cases >= 10 and counter_gaps >= 10  # the cases occurred


def first_exact(draft, z):
    target = z.argmax(-1).tolist()
    n = 0
    while n < len(draft) and draft[n] == target[n]:
        n += 1
    return n


# --- sampled (T > 0): the same distributions ------------------------------------------------------------------

SAMPLED_TRIALS = 2500


def sampled_case():
    """A small-vocabulary round (V = 4, K = 5) whose rows are uncertain enough for FLy to defer often."""
    z = torch.tensor(
        [
            [1.0, 0.6, 0.2, -1.0],
            [2.0, 0.1, 0.0, -0.5],
            [0.3, 0.9, 0.2, 0.0],
            [1.5, 1.4, -0.2, 0.0],
            [0.0, 0.1, 1.2, 0.4],
            [0.5, 0.4, 0.3, 0.2],
        ]
    )
    return [0, 0, 1, 1, 2], z


def outcome(tokens, k):
    """(accepted count, the token after them): what a round decides."""
    return (len(tokens) - 1, tokens[-1])


def homogeneity(a: Counter, b: Counter) -> float:
    """p-value of a chi-square test that two samples of outcomes come from one distribution (categories with
    fewer than 10 observations pooled)."""
    cats = sorted(set(a) | set(b))
    small = [c for c in cats if a[c] + b[c] < 10]
    rows = [[a[c] for c in cats if c not in small], [b[c] for c in cats if c not in small]]
    if small:
        rows[0].append(sum(a[c] for c in small))
        rows[1].append(sum(b[c] for c in small))
    return float(chi2_contingency(rows)[1])


def test_two_sample_variant_matches_the_official_distribution():
    """fly_sampling 'two-sample' (the official code's match at T > 0) against the official transcription:
    p > 0.001 on 2500 rounds each; the official rule with win_len = W (the window meaning slipped by one) is
    rejected by the same test (p < 1e-6)."""
    draft, z = sampled_case()
    k, w, theta, temperature = len(draft), 1, 0.3, 0.8
    probs = torch.softmax(z / temperature, -1)
    g_ours, g_ref = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    mine, ref, slipped = Counter(), Counter(), Counter()
    for _ in range(SAMPLED_TRIALS):
        v = fly_verify_two_sample(
            torch.tensor(draft), z, probs, g_ours, theta=theta, window_size=w, boundary="official"
        )
        mine[outcome(v.tokens.tolist(), k)] += 1
        ref[outcome(official_two_sample(draft, z, temperature, theta, w + 1, g_ref), k)] += 1
        slipped[outcome(official_two_sample(draft, z, temperature, theta, w, g_ref), k)] += 1
    p, p_slipped = homogeneity(mine, ref), homogeneity(mine, slipped)
    print(
        f"\nFLy conformance, two-sample (V 4, K 5, W 1, T {temperature}): {SAMPLED_TRIALS} rounds each, "
        f"chi-square p = {p:.3f} vs the official code; p = {p_slipped:.1e} vs win_len = W"
    )
    assert p > 1e-3 and p_slipped < 1e-6


def test_rejection_variant_matches_vllms_native_distribution():
    """fly_sampling 'rejection' (FLy on rejection sampling, as vLLM's native FLy verifies sampled requests)
    against the vLLM transcription, probabilistic drafts (q drawn each round) at T = 1: p > 0.001 on 2500 rounds
    each; vLLM's rule with W + 1 is rejected by the same test (p < 1e-6)."""
    _, z = sampled_case()
    k, w, theta = 5, 1, 0.3
    p = torch.softmax(z, -1)
    q = torch.softmax(
        torch.tensor(
            [
                [0.2, 1.0, 0.1, 0.0],
                [1.0, 0.8, 0.0, 0.0],
                [0.0, 0.5, 1.0, 0.0],
                [0.3, 1.2, 0.0, 0.1],
                [0.0, 0.0, 0.4, 1.1],
            ]
        ),
        -1,
    )
    g_draft, g_ours, g_ref = (torch.Generator().manual_seed(s) for s in (3, 4, 5))
    mine, ref, slipped = Counter(), Counter(), Counter()
    for _ in range(SAMPLED_TRIALS):
        draft = torch.multinomial(q, 1, generator=g_draft).squeeze(-1).tolist()
        v = fly_verify_rejection(torch.tensor(draft), q, z, p, g_ours, theta=theta, window_size=w)
        mine[outcome(v.tokens.tolist(), k)] += 1
        ref[outcome(vllm_native_sampled(draft, q, z, theta, w, g_ref), k)] += 1
        slipped[outcome(vllm_native_sampled(draft, q, z, theta, w + 1, g_ref), k)] += 1
    p_value, p_slipped = homogeneity(mine, ref), homogeneity(mine, slipped)
    print(
        f"\nFLy conformance, rejection (V 4, K 5, W 1, T 1): {SAMPLED_TRIALS} rounds each, chi-square p = "
        f"{p_value:.3f} vs vLLM's native rule; p = {p_slipped:.1e} vs W + 1"
    )
    assert p_value > 1e-3 and p_slipped < 1e-6


def test_loosespec_knobs_map_onto_vllms_native_config():
    """The native path passes loosespec's knobs under vLLM's names with the same meaning; what vLLM's native
    FLy cannot express is refused, not changed."""
    assert native_fly_config(
        {
            "fly_window_size": 5,
            "fly_entropy_threshold": 0.9,
            "fly_entropy_top_k": 3,
            "fly_boundary": "window",
            "fly_sampling": "two-sample",
        },
        15,
    ) == {"rejection_sample_method": "fly", "fly_window_size": 5, "fly_entropy_threshold": 0.9, "fly_entropy_top_k": 3}
    assert native_fly_config({"fly_window_size": None, "fly_entropy_threshold": None}, 8) == {
        "rejection_sample_method": "fly"
    }  # vLLM's own defaults: W = min(6, K - 1), theta 0.3
    with pytest.raises(ValueError, match="fly_boundary 'official'"):
        native_fly_config({"fly_boundary": "official"}, 15)
    with pytest.raises(ValueError, match="smaller than num_speculative_tokens"):
        native_fly_config({"fly_window_size": 8}, 8)
    with pytest.raises(ValueError, match=">= 2"):
        native_fly_config({}, 1)
    assert math.isinf(native_fly_config({"fly_entropy_threshold": math.inf}, 4)["fly_entropy_threshold"])
