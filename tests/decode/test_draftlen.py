"""Cost-aware draft length: hand-built cost curves and acceptance profiles, and the engine end to end."""

import pytest
import torch

from loosespec.config import DecodeConfig
from loosespec.cost import CostCurve
from loosespec.decode.draftlen import AcceptanceEstimate, DraftLengthPolicy
from loosespec.verify.fly import within_boundary

K = 15
FLAT = CostCurve((1, 16), (0.100, 0.110))  # a GPU-like verify: 16 tokens cost 1.1x one
STEEP = CostCurve((1, 16), (0.100, 1.130))  # bf16 on an AVX2 CPU: 16 tokens cost 11.3x one
INT8 = CostCurve((1, 2, 4, 8, 16), (0.100, 0.108, 0.115, 0.147, 0.245))  # int8 on the AVX2 CPU (issue 16's ratios)


def trained(rate: float, rounds: int = 400, max_k: int = K) -> AcceptanceEstimate:
    """An estimate fed rounds whose draft positions are each accepted with probability ``rate``."""
    est = AcceptanceEstimate(max_k, decay=1.0)
    g = torch.Generator().manual_seed(0)
    for _ in range(rounds):
        u = torch.rand(max_k, generator=g)
        accepted = int((u < rate).long().cumprod(0).sum())
        est.update(max_k, accepted)
    return est


def test_estimate_learns_conditional_acceptance():
    est = trained(0.8)
    assert all(abs(est.rate(i) - 0.8) < 0.1 for i in range(4))
    assert est.expected_tokens(0) == 1.0
    assert est.expected_tokens(3) == pytest.approx(
        1 + est.rate(0) + est.rate(0) * est.rate(1) + est.rate(0) * est.rate(1) * est.rate(2)
    )


def test_update_counts_only_reached_positions():
    est = AcceptanceEstimate(5, prior_weight=0.0 + 1e-9, decay=1.0)
    est.update(drafted=5, accepted=2)  # positions 0, 1 accepted; 2 rejected; 3, 4 never reached
    assert est.trials == [1, 1, 1, 0, 0] and est.hits == [1, 1, 0, 0, 0]


def test_unreached_positions_follow_the_evidence_before_them():
    """A lookup whose first token keeps missing is not judged deeper on the optimistic prior."""
    est = AcceptanceEstimate(K, decay=1.0)
    for _ in range(20):
        est.update(drafted=10, accepted=0)  # position 0 missed; positions 1.. never reached
    assert est.trials[1:] == [0.0] * (K - 1)
    assert est.rate(0) < 0.05 and est.rate(K - 1) == pytest.approx(est.rate(0))
    # a flat 0.9 prior at positions 2..10 would have made E(10) ~ 1.3 and drafted all 10
    assert est.expected_tokens(10) < 1.06
    assert DraftLengthPolicy(INT8, 0.0, K, est).best(10)[0] == 0


def test_a_new_draft_model_is_tried_short():
    """The first round of a costly level drafts a few tokens, not K; good evidence then lengthens it."""
    from loosespec.decode.draftlen import MODEL_PRIOR_MEAN

    policy = DraftLengthPolicy(INT8, 0.040, K, AcceptanceEstimate(K, prior_mean=MODEL_PRIOR_MEAN))
    first = policy.best(K)[0]
    assert 1 <= first <= 3
    for _ in range(20):
        k = policy.best(K)[0]
        policy.observe(k, k, draft_seconds=0.040 * k)  # every drafted token accepted
    assert policy.best(K)[0] > first


def test_flat_curve_and_good_acceptance_drafts_everything():
    assert DraftLengthPolicy(FLAT, 0.0, K, trained(0.8)).best(K)[0] == K


def test_steep_curve_with_low_acceptance_drafts_nothing():
    assert DraftLengthPolicy(STEEP, 0.0, K, trained(0.3)).best(K)[0] == 0


def test_draft_cost_shortens_the_draft():
    free = DraftLengthPolicy(INT8, 0.0, K, trained(0.7)).best(K)[0]
    costly = DraftLengthPolicy(INT8, 0.040, K, trained(0.7)).best(K)[0]  # each draft token 40% of a target step
    assert 0 < costly < free


def test_cap_is_respected():
    assert DraftLengthPolicy(FLAT, 0.0, K, trained(0.9)).best(3)[0] == 3


@pytest.mark.parametrize("curve", [FLAT, STEEP, INT8])
@pytest.mark.parametrize("rate", [0.05, 0.3, 0.6, 0.95])
@pytest.mark.parametrize("draft_cost", [0.0, 0.02, 0.08])
def test_never_chooses_below_autoregressive_rate(curve, rate, draft_cost):
    policy = DraftLengthPolicy(curve, draft_cost, K, trained(rate))
    k, rate = policy.best(K)
    assert rate == pytest.approx(policy.expected_rate(k))  # the one-pass E(k) equals the direct one
    assert policy.expected_rate(k) >= policy.expected_rate(0) == pytest.approx(1 / curve(1))
    assert all(policy.expected_rate(k) >= policy.expected_rate(j) for j in range(K + 1))


def test_forgetting_brings_drafting_back():
    """After a bad stretch the policy stops drafting; as evidence fades towards the prior it tries again."""
    mid = CostCurve((1, 16), (0.100, 0.400))  # 16 tokens cost 4x one
    policy = DraftLengthPolicy(mid, 0.0, K, AcceptanceEstimate(K, decay=0.9))
    for _ in range(30):
        policy.observe(K, 0)
    assert policy.best(K)[0] == 0
    for _ in range(60):  # rounds that drafted nothing carry no evidence, and the old evidence fades
        policy.observe(0, 0)
    assert policy.best(K)[0] > 0


def test_observe_learns_draft_token_cost():
    policy = DraftLengthPolicy(INT8, 0.05, K, draft_cost_decay=0.5)
    policy.observe(4, 2, draft_seconds=4 * 0.01)
    assert policy.draft_token_cost == pytest.approx(0.03)
    policy.observe(0, 0, None)  # nothing drafted: nothing learnt about the draft's cost
    assert policy.draft_token_cost == pytest.approx(0.03)


def test_fly_boundary_keeps_nominal_k():
    """The official boundary follows the nominal K when a round drafts fewer; vLLM's window boundary only asks
    that the window fit the draft. Either way a draft of W tokens or fewer never defers."""
    w = 5
    full = within_boundary(15, w, num_draft_tokens=15, boundary="official")
    assert int(full.nonzero().max()) == 15 - w - 2
    short = within_boundary(10, w, num_draft_tokens=15, boundary="official")  # the window must fit the 10 tokens
    assert int(short.nonzero().max()) == 10 - w - 1
    assert int(within_boundary(10, w).nonzero().max()) == 10 - w - 1  # window: j + W < k
    for boundary in ("window", "official"):
        assert not within_boundary(w, w, num_draft_tokens=15, boundary=boundary).any()
        assert within_boundary(w + 1, w, num_draft_tokens=15, boundary=boundary).tolist() == [True] + [False] * w


# --- a loose rule's deferrals priced (FLy): drafts past the window where deferrals pay, short where not ---------

W = 5


def simulate(policy, rounds: int, match: float, gate: float, window: float, seed: int = 0) -> list[int]:
    """Rounds of a FLy-like process: draft positions match natively with probability ``match``; at the first
    mismatch the gate is open with probability ``gate``, and the W positions after it match with probability
    ``window`` (the draft stays on track). Returns the draft length the policy chose each round."""
    from loosespec.verify.types import FirstMiss

    g = torch.Generator().manual_seed(seed)
    chosen = []
    for _ in range(rounds):
        k = policy.best(K)[0]
        chosen.append(k)
        if k == 0:
            policy.observe(0, 0)
            continue
        u = torch.rand(k, generator=g)
        m = int((u < match).long().cumprod(0).sum())  # native prefix
        if m == k:
            policy.observe(k, k)
            continue
        is_open = bool(torch.rand(1, generator=g) < gate)
        fits = m + W < k
        survives = bool(torch.rand(1, generator=g) < window)
        kept = is_open and fits and survives
        accepted = min(k, m + W + 1) if kept else m  # (the positions after the window are not simulated)
        policy.observe(k, accepted, first_miss=FirstMiss(m, is_open, fits, kept))
    return chosen


def fly_policy():
    from loosespec.decode.draftlen import LoosePrices

    return DraftLengthPolicy(INT8, 0.0, K, AcceptanceEstimate(K), loose=LoosePrices(W, "window", K))


def test_policy_drafts_past_the_window_once_deferrals_have_been_seen_to_pay():
    """Native acceptance alone keeps drafts short (0.6 per position on the int8 curve: 3 or 4 tokens). Where
    the gate is often open and the draft stays on track after a mismatch, the policy learns it, from short
    rounds (the gate) and exploration rounds (the window), and drafts past the window."""
    exact_only = simulate(DraftLengthPolicy(INT8, 0.0, K, AcceptanceEstimate(K)), 300, 0.6, 0.8, 0.95)
    assert max(exact_only[100:]) <= W  # exact verification's policy never drafts long enough to defer
    chosen = simulate(fly_policy(), 300, 0.6, 0.8, 0.95)
    late = chosen[100:]
    assert sum(k > W for k in late) / len(late) > 0.8


@pytest.mark.parametrize("gate,window", [(0.0, 0.95), (0.8, 0.0)])
def test_policy_stays_short_when_deferrals_do_not_pay(gate, window):
    """No open gate, or windows that never survive: a few exploration rounds at most, then drafts as short as
    exact verification's."""
    chosen = simulate(fly_policy(), 300, 0.6, gate, window)
    late = chosen[100:]
    assert sum(k > W for k in late) / len(late) < 0.1
    exact_only = simulate(DraftLengthPolicy(INT8, 0.0, K, AcceptanceEstimate(K)), 300, 0.6, gate, window)
    assert sorted(late)[len(late) // 2] == sorted(exact_only[100:])[50]  # the same median length


def test_exploration_rounds_are_counted():

    from loosespec.decode.draftlen import CostAwareDrafter, Level

    policy = fly_policy()
    d = CostAwareDrafter([Level("lookup", FakeDrafter("ngram", list(range(K))), policy)])
    events = []
    for _ in range(16):
        draft = d.propose(torch.tensor([1, 2, 3]), K)
        events.append(dict(draft.events))  # what the drafter chose travels on the draft
        d.feedback(len(draft), 1)  # an exact-looking round: no first miss reported, nothing learnt of the window
    explored = [e for e in events if e.get("rounds_explore")]
    assert 1 <= len(explored) <= 2 and all(e.get("rounds_lookup") for e in explored)
    assert policy.loose.explored == pytest.approx(
        sum(0.99 ** (15 - i) for i, e in enumerate(events) if e.get("rounds_explore"))
    )


def test_levels_sharing_one_loose_estimate_update_it_once_per_round():
    """MLA's two levels share FLy's estimate: one round decays and feeds it once, not once per level."""
    from types import SimpleNamespace

    from loosespec.decode.draftlen import CostAwareDrafter, Level, LoosePrices
    from loosespec.verify.types import FirstMiss

    shared = LoosePrices(W, "window", K)
    lm = SimpleNamespace(modelled_s=0.0, ids=torch.empty(0, dtype=torch.long), cost=None)
    d = CostAwareDrafter(
        [
            Level("lookup", FakeDrafter("ngram", list(range(K))), DraftLengthPolicy(INT8, 0.0, K, loose=shared)),
            Level("model", FakeDrafter("mla", list(range(K)), lm), DraftLengthPolicy(INT8, 0.04, K, loose=shared), lm),
        ]
    )
    for _ in range(3):
        draft = d.propose(torch.tensor([1, 2, 3]), K)
        d.feedback(len(draft), 1, FirstMiss(1, True, True, False))
    assert shared.gate[1] == pytest.approx(1 + 0.99 + 0.99**2)  # three observations, decayed once per round
    assert shared.kept == [0.0, pytest.approx(1 + 0.99 + 0.99**2)]


# --- end to end on the tiny pair, curves injected so the test does not depend on this machine's speed ---


def with_curves(engine, target: CostCurve, draft: CostCurve, cfg: DecodeConfig):
    engine._costs[("target", max(cfg.num_draft_tokens + 1, 16))] = target
    engine._costs[("draft", cfg.mla_lookup_tokens + 1)] = draft
    return engine


@pytest.mark.parametrize("drafter", ["ngram", "model", "mla"])
def test_adaptive_exact_equals_ar(tiny_engine, drafter):
    prompt = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"
    cfg = DecodeConfig.create("exact", drafter, has_draft_model=True, max_new_tokens=60)
    assert cfg.adaptive_draft_length
    with_curves(tiny_engine, FLAT, CostCurve((1, 16), (0.01, 0.011)), cfg)
    ar = tiny_engine.generate(prompt, DecodeConfig.create("ar", max_new_tokens=60), raw=True)
    r = tiny_engine.generate(prompt, cfg, raw=True)
    assert r.token_ids == ar.token_ids
    hist = r.stats.to_dict()["draft_length_histogram"]
    assert sum(hist.values()) == r.stats.rounds
    assert r.stats.drafted_tokens > 0


def test_adaptive_steep_curve_falls_back_to_plain_steps(tiny_engine):
    """Where verification is expensive and the draft model costs as much as the target, no round drafts."""
    prompt = "Once upon a time"
    cfg = DecodeConfig.create("exact", "model", has_draft_model=True, max_new_tokens=30)
    with_curves(tiny_engine, STEEP, CostCurve((1, 16), (0.1, 1.0)), cfg)
    r = tiny_engine.generate(prompt, cfg, raw=True)
    assert r.stats.drafted_tokens == 0 and r.stats.draft_forwards == 0
    assert r.stats.to_dict()["draft_length_histogram"] == {"0": r.stats.rounds}


class FakeDrafter:
    def __init__(self, name, tokens, lm=None, cost_per_token=0.0):
        self.name, self.tokens, self.lm, self.cost, self.calls = name, tokens, lm, cost_per_token, 0

    def propose(self, seq, k):
        self.calls += 1
        if self.lm is not None:
            self.lm.modelled_s += self.cost * min(k, len(self.tokens))
        from loosespec.drafters.base import Draft

        return Draft(torch.tensor(self.tokens[:k], dtype=torch.long))


def test_levels_pick_free_lookup_over_the_draft_model_and_learn_per_level():
    from types import SimpleNamespace

    from loosespec.decode.draftlen import CostAwareDrafter, Level

    lm = SimpleNamespace(modelled_s=0.0)
    lookup = FakeDrafter("ngram", list(range(8)))
    model = FakeDrafter("mla", list(range(15)), lm, cost_per_token=0.04)
    d = CostAwareDrafter(
        [
            Level("lookup", lookup, DraftLengthPolicy(INT8, 0.0, K)),
            Level("model", model, DraftLengthPolicy(INT8, 0.04, K), lm),
        ]
    )
    draft = d.propose(torch.tensor([1, 2, 3]), K)
    assert draft.events == {"rounds_lookup": 1} and len(draft) == draft.chosen > 0
    assert model.calls == 0  # the costly level never ran
    d.feedback(len(draft), len(draft))
    lookup.tokens = []  # no lookup match: the draft model drafts, and its modelled cost is learnt
    draft = d.propose(torch.tensor([1, 2, 3]), K)
    assert draft.events == {"rounds_model": 1} and model.calls == 1
    d.feedback(len(draft), 0)
    assert d.levels[1].policy.estimate.trials[0] > 0 and d.levels[1].policy.estimate.hits[0] == 0
    assert d.levels[1].policy.draft_token_cost == pytest.approx(0.04)
