"""FLy's rule, piece by piece and composed, on hand-built masks, entropies and logits."""

import math

import pytest
import torch

from loosespec.verify.fly import (
    fly_mask,
    fly_verify_greedy,
    fly_verify_rejection,
    fly_verify_two_sample,
    gate_open,
    loose_mask,
    topk_entropy,
    window_clear,
    within_boundary,
)
from loosespec.verify.types import FirstMiss

T, F = True, False


def mask(*bits):
    return torch.tensor(bits, dtype=torch.bool)


def entropies(k, **at):
    """Entropy 0 everywhere (target confident) except the given positions."""
    h = torch.zeros(k)
    for pos, value in at.items():
        h[int(pos[1:])] = value
    return h


# --- the worked example (methods.md §3, issue #3) ---------------------------------------------

WORKED = mask(T, T, F, T, T, T, T, T, T, F, T, T, T, T, T)


def test_worked_example_mask():
    h = entropies(15, p2=0.5, p9=0.8)
    official = fly_mask(WORKED, h, theta=0.3, window_size=5, boundary="official")
    # position 2 deferred (window 3..7 clean, 2 <= 15-5-2); position 9 fails the official boundary (9 > 8)
    assert official.tolist() == [T, T, T, T, T, T, T, T, T, F, T, T, T, T, T]
    # vLLM's boundary: 9's window 10..14 fits in the draft (9 + 5 < 15), so it is deferred too
    assert fly_mask(WORKED, h, theta=0.3, window_size=5).tolist() == [T] * 15


def logits_from(target_tokens, entropy_rows, vocab=50):
    """Logits whose argmax is target_tokens[j]; rows in entropy_rows get a flatter top-3."""
    z = torch.full((len(target_tokens), vocab), -20.0)
    for j, t in enumerate(target_tokens):
        z[j, t] = 10.0
        if j in entropy_rows:  # three near-equal candidates: top-3 entropy ~ ln 3
            z[j, (t + 1) % vocab] = 9.9
            z[j, (t + 2) % vocab] = 9.8
    return z


def test_worked_example_end_to_end_rule():
    target = list(range(1, 17))  # K + 1 = 16 rows
    draft = torch.tensor(target[:15])
    draft[2], draft[9] = 40, 41  # the two mismatches
    v = fly_verify_greedy(draft, logits_from(target, {2, 9}), theta=0.3, window_size=5, boundary="official")
    assert v.num_accepted == 9
    assert v.tokens.tolist() == draft[:9].tolist() + [target[9]]  # 9 kept (40 at 2 included) + target's 10
    assert len(v.tokens) == 10
    assert v.events == {
        "fly_prefix_mismatches": 2,
        "fly_deferred": 1,
        "fly_hard_rejects": 0,
        "fly_window_rejects": 0,
        "fly_boundary_rejects": 1,
        # the official counters, over all 15 positions: 2 mismatches, 1 the rule would keep
        "fly_initial_mismatches": 2,
        "fly_window_rescues": 1,
        "fly_deferrable_rounds": 1,
    }
    assert v.first_miss == FirstMiss(position=2, gate_open=True, deferrable=True, deferred=True)
    window = fly_verify_greedy(draft, logits_from(target, {2, 9}), theta=0.3, window_size=5)
    assert window.num_accepted == 15 and window.tokens.tolist() == draft.tolist() + [target[15]]
    assert window.events["fly_deferred"] == 2 and window.events["fly_window_rescues"] == 2


# --- each condition alone -----------------------------------------------------------------------


def test_entropy_hand_computation():
    p = torch.tensor([0.9, 0.05, 0.03, 0.02])
    h = topk_entropy(torch.log(p).unsqueeze(0), k=3)
    expect = -(0.9 * math.log(0.9) + 0.05 * math.log(0.05) + 0.03 * math.log(0.03))
    assert abs(float(h) - expect) < 1e-5 and abs(float(h) - 0.35) < 0.01


def test_entropy_not_renormalised_and_bounded():
    uniform = torch.zeros(1, 10)  # top-3 probabilities 0.1 each: 3 * 0.1 * ln 10, not ln 3
    assert abs(float(topk_entropy(uniform, 3)) - 0.3 * math.log(10)) < 1e-5
    three = torch.log(torch.tensor([[1 / 3, 1 / 3, 1 / 3, 1e-12]]))
    assert abs(float(topk_entropy(three, 3)) - math.log(3)) < 1e-4  # the maximum, ln 3


def test_gate_at_threshold_is_open():
    assert gate_open(torch.tensor([0.29, 0.3, 0.31]), 0.3).tolist() == [F, T, T]
    assert gate_open(torch.tensor([0.0, 0.5]), 0.0).all()  # theta = 0 disables the gate


def test_window_counts_the_positions_after_the_mismatch():
    m = mask(F, T, T, F, T, T, T)
    # W = 2 (vLLM's meaning): position j needs j+1, j+2 clean: 0 yes; 1 and 2 no (3 is a mismatch); 3 yes (4, 5)
    assert window_clear(m, 2).tolist() == [T, F, F, T, T, T, T]
    assert window_clear(m, 0).all()  # W = 0: nothing after the mismatch is checked


def test_boundary_window_and_official():
    assert within_boundary(15, 5).tolist() == [j <= 9 for j in range(15)]  # vLLM: j + W < K
    assert within_boundary(15, 5, boundary="official").tolist() == [j <= 8 for j in range(15)]  # j <= K - W - 2
    assert not within_boundary(4, 4).any() and not within_boundary(4, 4, boundary="official").any()
    assert within_boundary(4, 0, boundary="official").tolist() == [T, T, T, F]  # the official code's W = 1
    assert within_boundary(4, 0).all()
    # a round cut shorter than the nominal K: the official bound keeps K's and the window must fit the draft
    assert within_boundary(8, 5, num_draft_tokens=15, boundary="official").tolist() == [j <= 2 for j in range(8)]
    with pytest.raises(ValueError, match="fly_boundary"):
        within_boundary(8, 5, boundary="vllm")


# --- boundary cases of the composition ----------------------------------------------------------


def test_window_does_not_fit():
    m = mask(T, T, T, T, T, T, T, F, T, T)  # K = 10, W = 6: bound j <= 3
    assert fly_mask(m, entropies(10, p7=1.0), 0.3, 6).tolist() == m.tolist()


def test_two_mismatches_inside_one_window():
    # mismatch at 1 has another at 3 inside its window: 1 is not deferred; 3 is judged on its own
    m = mask(T, F, T, F, T, T, T, T, T, T, T, T, T, T, T)
    a = fly_mask(m, entropies(15, p1=1.0, p3=1.0), 0.3, 6)
    assert a[1].item() is False
    assert a[3].item() is True  # its window 4..8 is clean and 3 <= 8


def test_window_longer_than_draft_is_exact():
    m = mask(T, F, T, T)
    assert fly_mask(m, entropies(4, p1=1.0), 0.0, 6).tolist() == m.tolist()


def test_theta_zero_defers_confident_mismatches():
    m = mask(F, T, T, T, T, T, T, T, T, T)
    assert fly_mask(m, torch.zeros(10), 0.0, 6)[0].item() is True  # gate disabled
    assert fly_mask(m, torch.zeros(10), 0.3, 6)[0].item() is False  # confident target: hard reject


def test_window_size_zero():
    m = mask(T, F, F, T)
    # official: every uncertain mismatch up to K - 2 is kept, the last position never is; window: every one is
    assert fly_mask(m, torch.ones(4), 0.3, 0, boundary="official").tolist() == [T, T, T, T]
    assert fly_mask(mask(T, T, T, F), torch.ones(4), 0.3, 0, boundary="official").tolist() == [T, T, T, F]
    assert fly_mask(mask(T, T, T, F), torch.ones(4), 0.3, 0).tolist() == [T, T, T, T]


def test_ablations_are_compositions():
    m = mask(F, T, T, T, T, T, T, T, T, T)
    h = torch.zeros(10)  # confident everywhere
    window_only = loose_mask(m, window_clear(m, 6), within_boundary(10, 6))
    gate_only = loose_mask(m, gate_open(h, 0.3))
    assert window_only[0].item() is True and gate_only[0].item() is False
    assert torch.equal(loose_mask(m), torch.ones(10, dtype=torch.bool))  # no conditions: accept all


def test_gate_closed_equals_exact_on_random_cases():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        k = int(torch.randint(1, 16, (1,), generator=g))
        m = torch.rand(k, generator=g) < 0.7
        h = torch.rand(k, generator=g) * math.log(3)
        assert torch.equal(fly_mask(m, h, math.log(3) + 1e-3, 5), m)


# --- sampling variants ---------------------------------------------------------------------------


def test_two_sample_matches_either_sample_and_is_seeded():
    probs = torch.tensor([[0.5, 0.5, 0.0]] * 4)
    logits = torch.log(probs.clamp_min(1e-9))
    draft = torch.tensor([0, 1, 0])
    runs = [
        fly_verify_two_sample(draft, logits, probs, torch.Generator().manual_seed(s), theta=10.0).tokens.tolist()
        for s in (1, 1, 2)
    ]
    assert runs[0] == runs[1]
    # with two samples from {0, 1} a draft token matches with probability 3/4 per position
    g = torch.Generator().manual_seed(0)
    kept = sum(
        fly_verify_two_sample(torch.tensor([0]), logits[:2], probs[:2], g, theta=10.0).num_accepted for _ in range(4000)
    )
    assert abs(kept / 4000 - 0.75) < 0.03


def test_rejection_variant_defers_a_native_reject():
    # row 0: p(d_0) = 0 -> native reject for sure; uncertain row (entropy ~ ln 3); rows 1..7 certain matches
    k = 8
    probs = torch.zeros(k + 1, 6)
    probs[0, 1:4] = 1 / 3
    for j in range(1, k + 1):
        probs[j, 5] = 1.0
    logits = torch.log(probs.clamp_min(1e-12))
    draft = torch.tensor([0] + [5] * (k - 1))
    g = torch.Generator().manual_seed(0)
    loose = fly_verify_rejection(draft, None, logits, probs, g, theta=0.3, window_size=3)
    assert loose.num_accepted == k and loose.events["fly_deferred"] == 1
    strict = fly_verify_rejection(draft, None, logits, probs, g, theta=2.0, window_size=3)
    assert strict.num_accepted == 0 and strict.tokens[0].item() in (1, 2, 3)


@pytest.mark.parametrize("k", [0, 1])
def test_tiny_drafts(k):
    v = fly_verify_greedy(torch.arange(k), torch.randn(k + 1, 7))
    assert v.tokens.shape[0] == v.num_accepted + 1 <= k + 1


@pytest.mark.parametrize("theta", [1e-6, 0.005, 0.01])
def test_theta_in_the_official_codes_off_range_is_refused(theta):
    """The official code gates only when theta > 0.01; a theta in (0, 0.01] is refused with a clear error (0 turns
    the gate off here, as there), in the library and in the vLLM plugin alike."""
    from loosespec.config import ConfigError, DecodeConfig
    from loosespec.integrations.vllm.rule import FlySettings

    with pytest.raises(ConfigError, match="pass 0 to turn the gate off") as e:
        DecodeConfig.create("fly", fly_entropy_threshold=theta)
    assert e.value.field == "fly_entropy_threshold"
    with pytest.raises(ValueError, match="ambiguous"):
        FlySettings(fly_entropy_threshold=theta)
    # the rule functions refuse it too: one behaviour at every entry point
    with pytest.raises(ValueError, match="ambiguous"):
        gate_open(torch.ones(3), theta)
    with pytest.raises(ValueError, match="ambiguous"):
        fly_verify_greedy(torch.tensor([1, 2]), torch.randn(3, 7), theta=theta, window_size=0)
    with pytest.raises(ValueError, match="ambiguous"):
        fly_mask(mask(T, F), torch.ones(2), theta, 0)
    assert DecodeConfig.create("fly", fly_entropy_threshold=0.0).fly_entropy_threshold == 0.0
    assert DecodeConfig.create("fly", fly_entropy_threshold=0.0101).fly_entropy_threshold == 0.0101


def test_the_registry_names_the_counters_the_rule_emits():
    """The counter names declared with the rule (what the vLLM plugin exports) are the ones it emits, and the
    method registry (what the server exports) names them for fly."""
    from loosespec.methods import METHODS
    from loosespec.verify.fly import FLY_COUNTERS, FLY_OFFICIAL_COUNTERS, FLY_ROUND_COUNTERS, fly_accept

    _, events = fly_accept(torch.tensor([True, False, True]), torch.randn(3, 7), 0.3, 1)
    assert set(events) == set(FLY_COUNTERS + FLY_OFFICIAL_COUNTERS + FLY_ROUND_COUNTERS)
    assert set(events) <= set(METHODS["fly"].counters)


def _events_reference(match, entropy, theta, window_size, accept, num_draft_tokens=None, boundary="window"):
    """fly_events as it was before its counters were read in one transfer: position by position."""
    from loosespec.verify.exact import first_false
    from loosespec.verify.fly import gate_open, window_clear, within_boundary

    n = first_false(accept)
    k = match.shape[0]
    upto = slice(0, min(n + 1, k))
    miss = ~match[upto]
    gate_all = gate_open(entropy[:k], theta)
    window_all = window_clear(match, window_size)
    bound_all = within_boundary(k, window_size, match.device, num_draft_tokens, boundary)
    gate, window, bound = gate_all[upto], window_all[upto], bound_all[upto]
    rescues = sum(1 for j in range(k) if not match[j] and gate_all[j] and window_all[j] and bound_all[j])
    return {
        "fly_prefix_mismatches": int(miss.sum()),
        "fly_deferred": int((miss & accept[upto]).sum()),
        "fly_hard_rejects": int((miss & ~gate).sum()),
        "fly_window_rejects": int((miss & gate & ~window).sum()),
        "fly_boundary_rejects": int((miss & gate & window & ~bound).sum()),
        "fly_initial_mismatches": int((~match).sum()),
        "fly_window_rescues": rescues,
        "fly_deferrable_rounds": int(bool(bound_all.any())),
    }


def test_fly_counters_read_in_one_transfer_equal_the_per_counter_reading():
    """The counters are computed on the device and read together (one sync per round on a GPU, issue 22, 6):
    the same numbers as counting position by position, over random rounds of every length."""
    from loosespec.verify.fly import fly_events, fly_mask

    g = torch.Generator().manual_seed(0)
    for trial in range(400):
        k = int(torch.randint(0, 17, (1,), generator=g))
        match = torch.rand(k, generator=g) < 0.7
        entropy = torch.rand(k, generator=g)
        w = int(torch.randint(0, 6, (1,), generator=g))
        nominal = None if trial % 2 else 15
        boundary = ("window", "official")[trial % 3 == 0]
        accept = fly_mask(match, entropy, 0.3, w, nominal, boundary=boundary)
        got = fly_events(match, entropy, 0.3, w, accept, nominal, boundary=boundary)
        assert got == _events_reference(match, entropy, 0.3, w, accept, nominal, boundary), (k, w)
        assert all(type(v) is int for v in got.values())


# --- the copy guard (a labeled variant, off by default; issue 20) --------------------------------


def test_copy_guard_marks_the_positions_whose_next_n_tokens_are_in_the_prompt():
    from loosespec.verify.fly import PromptCopyGuard

    guard = PromptCopyGuard(torch.tensor([7, 8, 9, 10, 11]), 3)
    assert guard.grams == {(7, 8, 9), (8, 9, 10), (9, 10, 11)}
    # j = 1 starts 8 9 10 (in the prompt); j = 0 starts 5 8 9 (not); j = 3, 4 run past the draft's end
    assert guard(torch.tensor([5, 8, 9, 10, 11])).tolist() == [F, T, T, F, F]
    assert PromptCopyGuard([1, 2], 3).grams == frozenset()  # a prompt shorter than n has no n-gram
    with pytest.raises(ValueError, match="at least one token"):
        PromptCopyGuard([1, 2], 0)


def test_copy_guard_refuses_the_worked_examples_deferral_when_it_copies_the_prompt():
    """The worked example's deferral at j = 2 keeps draft 40, 4, 5, 6 ...: with those four tokens in the
    prompt the guard refuses it (2 kept + the target's token), without them the verdict is the paper's."""
    from loosespec.verify.fly import PromptCopyGuard

    target = list(range(1, 17))
    draft = torch.tensor(target[:15])
    draft[2], draft[9] = 40, 41
    logits = logits_from(target, {2, 9})
    copying = PromptCopyGuard([99, 40, 4, 5, 6, 98], 4)(draft)
    v = fly_verify_greedy(draft, logits, theta=0.3, window_size=5, copy=copying, boundary="official")
    assert v.tokens.tolist() == draft[:2].tolist() + [target[2]]
    assert v.events == {
        "fly_prefix_mismatches": 1,
        "fly_deferred": 0,
        "fly_hard_rejects": 0,
        "fly_window_rejects": 0,
        "fly_boundary_rejects": 0,
        "fly_copy_rejects": 1,
        "fly_initial_mismatches": 2,
        "fly_window_rescues": 0,
        "fly_deferrable_rounds": 1,
    }
    clean = PromptCopyGuard([99, 40, 4, 5, 98], 4)(draft)  # 40 4 5 but not 40 4 5 6
    paper = fly_verify_greedy(draft, logits, theta=0.3, window_size=5, boundary="official")
    guarded = fly_verify_greedy(draft, logits, theta=0.3, window_size=5, copy=clean, boundary="official")
    assert guarded.tokens.tolist() == paper.tokens.tolist() and guarded.events["fly_copy_rejects"] == 0


def test_copy_guard_only_ever_keeps_less_and_keeps_what_the_target_chose():
    """Random rounds: the guarded mask is the paper's mask with some deferrals taken back, never more kept,
    and every position it gives up was a deferral that copies the prompt."""
    g = torch.Generator().manual_seed(1)
    for _ in range(300):
        k = int(torch.randint(1, 16, (1,), generator=g))
        match = torch.rand(k, generator=g) < 0.7
        h = torch.rand(k, generator=g)
        copy = torch.rand(k, generator=g) < 0.5
        paper = fly_mask(match, h, 0.3, 3)
        guarded = fly_mask(match, h, 0.3, 3, copy=copy)
        assert not (guarded & ~paper).any()
        assert ((paper & ~guarded) == (paper & ~match & copy)).all()


def test_fly_rule_with_the_copy_guard_needs_the_prompt():
    """The method registry builds the guard from the knob and the request's prompt (refusing a guard without
    one); the rule it makes refuses the worked example's copying deferral and counts it."""
    from loosespec.config import DecodeConfig
    from loosespec.drafters.base import Draft
    from loosespec.methods import METHODS
    from loosespec.verify import SamplingParams

    cfg = DecodeConfig.create(
        "fly", "ngram", fly_copy_guard=4, num_draft_tokens=15, fly_boundary="official", fly_window_size=5
    )
    with pytest.raises(ValueError, match="prompt_ids"):
        METHODS["fly"].make_rule(cfg, SamplingParams(0.0), None)
    target = list(range(1, 17))
    draft = torch.tensor(target[:15])
    draft[2], draft[9] = 40, 41
    rule = METHODS["fly"].make_rule(cfg, SamplingParams(0.0), None, torch.tensor([99, 40, 4, 5, 6, 98]))
    v = rule(Draft(draft), logits_from(target, {2, 9}))
    assert v.num_accepted == 2 and v.events["fly_copy_rejects"] == 1
    plain = DecodeConfig.create(
        "fly", "ngram", num_draft_tokens=15, fly_boundary="official", fly_window_size=5, fly_copy_guard=0
    )
    off = METHODS["fly"].make_rule(plain, SamplingParams(0.0), None)(Draft(draft), logits_from(target, {2, 9}))
    assert off.num_accepted == 9 and "fly_copy_rejects" not in off.events


def test_copy_guard_knob_is_labeled_lossy_and_validated():
    from loosespec.config import KNOBS, ConfigError, DecodeConfig

    assert KNOBS["fly_copy_guard"].metadata["knob"].lossy == "FLy"
    assert "LOSSY" in KNOBS["fly_copy_guard"].metadata["knob"].help
    assert DecodeConfig.create("fly", "ngram", fly_preset="paper").fly_copy_guard == 0  # the paper's rule
    with pytest.raises(ConfigError):
        DecodeConfig.create("fly", "ngram", fly_copy_guard=-1)


# --- one meaning per name: vLLM's fly_window_size, the official code as a configuration --------------------------


def _vllm_greedy_reference(draft, target, entropy, theta, w):
    """vLLM's native FLy, greedy (its docs/features/speculative_decoding/fly.md, read as a loop): a mismatch at pos
    is kept iff pos + W < K, the entropy there is >= theta, and the W native decisions after it all accept."""
    k = len(draft)
    keep = [d == t for d, t in zip(draft, target)]
    for pos in range(k):
        if keep[pos] or not (pos + w < k and entropy[pos] >= theta):
            continue
        keep[pos] = all(draft[pos + o] == target[pos + o] for o in range(1, w + 1))
    n = 0
    while n < k and keep[n]:
        n += 1
    return n


def _official_reference(match, entropy, theta, w_official, k_nominal):
    """The official FLy code's mask, its W counting the mismatch: positions j+1 .. j+W-1 match, j <= K - W - 1."""
    k = len(match)
    out = list(match)
    for j in range(k):
        if not match[j] and entropy[j] >= theta and j <= min(k_nominal - w_official - 1, k - w_official):
            out[j] = all(match[j + o] for o in range(1, w_official) if j + o < k)
    return out


@pytest.mark.parametrize(
    "draft,target,hot,w,kept",
    [
        # hand-built: K = 8, mismatch at 2 with an open gate
        ([1, 2, 9, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8], {2}, 5, 8),  # 2 + 5 < 8: window 3..7 all match: kept
        ([1, 2, 9, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8], {2}, 6, 2),  # 2 + 6 = 8: the window does not fit
        ([1, 2, 9, 4, 5, 0, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8], {2}, 2, 5),  # window 3..4 matches, then 5 misses (cold)
        ([1, 2, 9, 4, 5, 0, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8], {2}, 3, 2),  # window 3..5 holds 5's mismatch
        ([1, 2, 9, 4, 5, 0, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8], {2, 5}, 2, 8),  # 5 is hot too, its window 6..7 matches
        ([1, 2, 9, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8], set(), 1, 2),  # gate closed: an exact reject
        ([0, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8], {0}, 0, 8),  # W = 0: an open gate alone keeps it
    ],
)
def test_fly_window_size_means_what_it_means_in_vllm(draft, target, hot, w, kept):
    """fly_window_size counts the native decisions AFTER the mismatch (vLLM's native FLy), and the default
    boundary is vLLM's (the window fits in the draft): hand-built rounds, each checked against a direct reading
    of vLLM's definition, then the same on random rounds."""
    h = torch.tensor([1.0 if j in hot else 0.0 for j in range(len(draft))])
    assert _vllm_greedy_reference(draft, target, h.tolist(), 0.3, w) == kept
    z = torch.full((len(target) + 1, 20), -5.0)
    for j, t in enumerate(target + [19]):
        z[j, t] = 5.0
        if j in hot:  # a flat top-3 around the target's choice: entropy near ln 3
            z[j, (t + 1) % 20] = z[j, (t + 2) % 20] = 4.9
    v = fly_verify_greedy(torch.tensor(draft), z, theta=0.3, window_size=w)
    assert v.num_accepted == kept


def test_vllm_definition_on_random_rounds():
    g = torch.Generator().manual_seed(7)
    for _ in range(500):
        k = int(torch.randint(1, 12, (1,), generator=g))
        w = int(torch.randint(0, k, (1,), generator=g))
        target = torch.randint(0, 4, (k,), generator=g).tolist()
        draft = [t if torch.rand(1, generator=g) < 0.75 else (t + 1) % 4 for t in target]
        h = (torch.rand(k, generator=g) * 0.8).tolist()
        match = torch.tensor([d == t for d, t in zip(draft, target)])
        got = int(fly_mask(match, torch.tensor(h), 0.3, w).long().cumprod(0).sum())
        assert got == _vllm_greedy_reference(draft, target, h, 0.3, w), (draft, target, h, w)


def test_the_official_configuration_is_w_minus_one_with_the_official_boundary():
    """The official code's W = 6 (counting the mismatch) is fly_window_size = 5 with fly_boundary official:
    the same mask on random rounds, drafts cut shorter than the nominal K included."""
    g = torch.Generator().manual_seed(3)
    for trial in range(500):
        k = int(torch.randint(1, 16, (1,), generator=g))
        w_official = int(torch.randint(1, 8, (1,), generator=g))
        match = torch.rand(k, generator=g) < 0.75
        h = torch.rand(k, generator=g)
        nominal = 15 if trial % 2 else k
        ours = fly_mask(match, h, 0.3, w_official - 1, nominal, boundary="official").tolist()
        assert ours == _official_reference(match.tolist(), h.tolist(), 0.3, w_official, nominal)


def test_first_miss_reports_the_first_native_rejection():
    z_tokens = [1] * 9
    draft = torch.tensor([1, 1, 5, 1, 1, 1, 1, 1])
    z = logits_from(z_tokens, {2})
    v = fly_verify_greedy(draft, z, theta=0.3, window_size=3)
    assert v.first_miss == FirstMiss(2, gate_open=True, deferrable=True, deferred=True) and v.num_accepted == 8
    short = fly_verify_greedy(draft[:5], z[:6], theta=0.3, window_size=3)  # 2 + 3 = 5: no room for the window
    assert short.first_miss == FirstMiss(2, gate_open=True, deferrable=False, deferred=False)
    cold = fly_verify_greedy(draft, logits_from(z_tokens, set()), theta=0.3, window_size=3)
    assert cold.first_miss == FirstMiss(2, gate_open=False, deferrable=True, deferred=False)
    assert fly_verify_greedy(torch.tensor([1, 1]), z[:3], window_size=0).first_miss is None  # nothing rejected
