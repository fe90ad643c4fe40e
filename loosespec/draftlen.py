"""Cost-aware draft length: each round drafts only as far as it pays (beyond the papers, which fix K).

Each round the engine may draft 0..K tokens. Drafting k tokens and verifying them in one target
forward is expected to commit

    E(k) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_k

tokens, where ``a_i`` is the running estimate of the probability that draft position i is accepted
given that position i - 1 was, for the current drafter and rule; it costs

    T(k) = D(k) + c_target(k + 1)

seconds, ``c_target`` the target's measured cost curve (:mod:`loosespec.cost`) and ``D(k)`` the
draft's modelled cost of k tokens (draft-model forwards priced by the draft's own cost curve;
n-gram lookup is free). The round drafts the k that maximises ``E(k) / T(k)``. ``k = 0`` (one
plain target step, the rate of autoregressive decoding) is always a candidate, so the policy
never *chooses* to be slower than ``ar``: where no k pays, it verifies none.

The estimate lives with the drafter (:class:`CostAwareDrafter`), which learns each round's
outcome through ``feedback(drafted, accepted)`` (as transformers' ``update_candidate_strategy``).
Counts decay by ``decay`` per round, towards the prior, so a drafter that stopped paying is
tried again after a while: that exploration is the only time the policy drafts where its current
estimate says it does not pay.

Everything the choice depends on is deterministic given the cached cost curves (modelled costs,
not wall-clock time), so a run reproduces its draft lengths, and a lossy method's output, exactly.

FLy: the rule's deferral boundary keeps the nominal K the user asked for
(:func:`loosespec.verify.fly.within_boundary`), so a shorter draft never defers where a full one
would not; FLy with k <= W cannot defer at all, which the estimate learns as lower acceptance.
"""

from __future__ import annotations

from collections import Counter

import torch

from .cost import CostCurve
from .drafters.base import EMPTY_DRAFT, Draft

# Optimistic before any evidence (a new drafter is tried), worth one round of evidence: a drafter that
# does not pay is dropped after a round or two, and one that does is kept.
PRIOR_MEAN = 0.9  # conditional acceptance before any evidence
PRIOR_WEIGHT = 1.0  # in rounds
DECAY = 0.97  # per round: evidence older than ~30 rounds fades towards the prior


class AcceptanceEstimate:
    """Per-position conditional acceptance ``a_i`` with forgetting, for positions 1..max_k."""

    def __init__(self, max_k: int, prior_mean: float = PRIOR_MEAN, prior_weight: float = PRIOR_WEIGHT,
                 decay: float = DECAY):
        self.max_k = max_k
        self.prior_mean = prior_mean
        self.prior_weight = prior_weight
        self.decay = decay
        self.hits = [0.0] * max_k  # position i (0-based) accepted, having been reached
        self.trials = [0.0] * max_k  # position i drafted and reached (every earlier position accepted)

    def rate(self, i: int) -> float:
        """``a_{i+1}``: P(position i accepted | positions 0..i-1 accepted), 0-based i."""
        return (self.hits[i] + self.prior_mean * self.prior_weight) / (self.trials[i] + self.prior_weight)

    def update(self, drafted: int, accepted: int) -> None:
        """One round's outcome: ``accepted`` of ``drafted`` draft tokens kept (a prefix)."""
        for i in range(self.max_k):
            self.hits[i] *= self.decay
            self.trials[i] *= self.decay
        for i in range(min(drafted, accepted + 1, self.max_k)):
            self.trials[i] += 1
            self.hits[i] += i < accepted

    def expected_tokens(self, k: int) -> float:
        """``E(k)``: committed tokens expected from a round drafting k (bonus or correction included)."""
        total, reach = 1.0, 1.0
        for i in range(min(k, self.max_k)):
            reach *= self.rate(i)
            total += reach
        return total


class DraftLengthPolicy:
    """Chooses each round's draft length from the cost curves and the acceptance estimate."""

    def __init__(self, target_cost: CostCurve, draft_token_cost: float, max_k: int,
                 estimate: AcceptanceEstimate | None = None, draft_cost_decay: float = 0.8):
        self.target_cost = target_cost
        self.draft_token_cost = draft_token_cost  # modelled seconds per drafted token (0 for n-gram lookup)
        self.max_k = max_k
        self.estimate = estimate or AcceptanceEstimate(max_k)
        self.draft_cost_decay = draft_cost_decay
        self.histogram: Counter[int] = Counter()

    def expected_rate(self, k: int) -> float:
        """Expected committed tokens per second of a round drafting k."""
        return self.estimate.expected_tokens(k) / (k * self.draft_token_cost + self.target_cost(k + 1))

    def best(self, k_cap: int) -> tuple[int, float]:
        """The draft length in 0..k_cap with the highest expected rate, and that rate."""
        best_k, best = 0, self.expected_rate(0)
        for k in range(1, min(k_cap, self.max_k) + 1):
            r = self.expected_rate(k)
            if r > best:
                best_k, best = k, r
        return best_k, best

    def choose(self, k_cap: int) -> int:
        k = self.best(k_cap)[0]
        self.histogram[k] += 1
        return k

    def observe(self, drafted: int, accepted: int, draft_seconds: float | None = None) -> None:
        """The round's outcome; ``draft_seconds``: the modelled cost of what was drafted."""
        self.estimate.update(drafted, accepted)
        if drafted and draft_seconds is not None:
            a = self.draft_cost_decay
            self.draft_token_cost = a * self.draft_token_cost + (1 - a) * draft_seconds / drafted


class CostAwareDrafter:
    """Wraps a drafter: asks it for the policy's k each round and learns from the outcome.

    ``draft_lm``: the draft model's :class:`~loosespec.kv.CachedLM` (None for n-gram lookup), whose
    ``modelled_s`` (its forwards priced by its cost curve) gives the draft's cost per round.
    """

    def __init__(self, inner, policy: DraftLengthPolicy, draft_lm=None):
        self.inner = inner
        self.name = inner.name
        self.policy = policy
        self.draft_lm = draft_lm
        self.last_choice: int | None = None
        self._draft_s: float | None = None

    def propose(self, seq: torch.Tensor, k: int) -> Draft:
        k = self.policy.choose(k)
        self.last_choice = k
        if k == 0:
            self._draft_s = None
            return EMPTY_DRAFT
        before = self.draft_lm.modelled_s if self.draft_lm is not None else 0.0
        draft = self.inner.propose(seq, k)
        self._draft_s = (self.draft_lm.modelled_s - before) if self.draft_lm is not None else 0.0
        return draft

    def feedback(self, drafted: int, accepted: int) -> None:
        self.policy.observe(drafted, accepted, self._draft_s)


class LeveledDrafter:
    """FLy's multi-level drafter with a cost-aware choice of level each round.

    The n-gram lookup proposal is free; the draft model (MLA: itself sped up by lookup) costs
    forwards. Each round compares three options by expected committed tokens per second: the lookup
    proposal alone (up to its length), the draft model's proposal (up to K), and no draft. Each
    level keeps its own acceptance estimate (lookup proposals are right or wrong in long runs; the
    draft model's acceptance is steadier), and the level not used decays towards its prior so that
    it is tried again. Where lookup finds long copies (summaries, edits of code in the prompt) the
    draft model is not run at all.
    """

    def __init__(self, lookup, model, lookup_policy: DraftLengthPolicy, model_policy: DraftLengthPolicy, draft_lm):
        self.lookup = lookup
        self.model = model
        self.name = model.name
        self.policies = {"lookup": lookup_policy, "model": model_policy}
        self.draft_lm = draft_lm
        self.last_choice: int | None = None
        self.level: str | None = None
        self.round_events: dict[str, int] = {}
        self._draft_s: float | None = None

    def propose(self, seq: torch.Tensor, k: int) -> Draft:
        proposal = self.lookup.propose(seq, k)
        options = [("none", 0, self.policies["model"].expected_rate(0))]
        if len(proposal):
            ka, ra = self.policies["lookup"].best(len(proposal))
            options.append(("lookup", ka, ra))
        kb, rb = self.policies["model"].best(k)
        options.append(("model", kb, rb))
        level, chosen, _ = max(options, key=lambda o: o[2])  # ties keep the cheaper, earlier option
        if chosen == 0:
            level = "none"
        self.level, self.last_choice = level, chosen
        self.round_events = {f"rounds_{level}": 1}
        self._draft_s = 0.0
        if level == "none":
            return EMPTY_DRAFT
        if level == "lookup":
            return Draft(proposal.tokens[:chosen])
        before = self.draft_lm.modelled_s
        draft = self.model.propose(seq, chosen)
        self._draft_s = self.draft_lm.modelled_s - before
        return draft

    def feedback(self, drafted: int, accepted: int) -> None:
        for level, policy in self.policies.items():
            if level == self.level:
                policy.observe(drafted, accepted, self._draft_s if level == "model" else None)
                policy.histogram[self.last_choice] += 1
            else:
                policy.observe(0, 0)  # no evidence: older evidence fades, so the level is tried again
