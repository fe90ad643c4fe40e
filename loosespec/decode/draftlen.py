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
outcome through ``feedback(drafted, accepted, first_miss)`` (the
:class:`~loosespec.drafters.base.Drafter` protocol's, as transformers' ``update_candidate_strategy``)
and returns what it chose on the :class:`~loosespec.drafters.base.Draft` (``chosen``, and the level
in ``events``). A drafter with levels (MLA: the free n-gram lookup, then the draft
model) keeps one estimate per level and each round picks the level and the length together, or no
draft. A draft model that has not read the latest committed tokens (rounds another level drafted)
must catch up first (:func:`catch_up_s`): that cost is charged to the choice spread over
:data:`CATCH_UP_ROUNDS` rounds and kept out of its per-token cost, as its first read of the prompt
is (``CachedLM.modelled_prefill_s``).
Counts decay by ``decay`` per round, towards the prior, so a drafter that stopped paying is
tried again after a while: that exploration is the only time the policy drafts where its current
estimate says it does not pay.

The prior is hierarchical: position 1's prior is ``prior_mean``, and each later position's is the
estimate for the position before it, so a position never reached yet is judged by the evidence
that is there, not by an optimistic constant (a lookup whose first token is rarely right does not
keep drafting ten). A draft model's first rounds cost real time, so its level starts from a lower
``prior_mean`` (:data:`MODEL_PRIOR_MEAN`) than free lookup: a new draft model is tried at a short
length and drafts further only as the evidence says it pays.

Everything the choice depends on is deterministic given the cached cost curves (modelled costs,
not wall-clock time), so a run reproduces its draft lengths, and a lossy method's output, exactly.

**A loose rule** (FLy) keeps some rejected draft tokens, so a longer draft buys more than the
exact-match chain above: a mismatch at ``j`` is deferred when the target's gate is open there and the
``W`` tokens after it match, which needs ``j + W < k`` (the rule's boundary,
:func:`loosespec.verify.fly.within_boundary`). A policy that priced only exact matches would keep
drafts too short to defer and silently turn FLy into exact verification. So with a loose rule the
estimate also learns, from each round's first native rejection (:class:`loosespec.verify.types.FirstMiss`),
how often the gate is open there (``g``; every round with a mismatch tells) and how often the rule
then keeps it when the draft was long enough (``s``: the window survived, the copy guard let it; only
rounds long enough tell, and before they do ``s`` is the chance of ``W`` exact matches in a row). E(k)
then adds the deferral paths (:meth:`LoosePrices.expected_tokens`):

    at each position j reached:  match (a_j) -> j + 1;  mismatch deferred ((1 - a_j) g s, j deferrable)
                                 -> positions j .. j + W kept, continue at j + W + 1;  else stop.

Rounds too short to defer never show whether windows survive, so while ``s`` rests on little
evidence, every :data:`EXPLORE_EVERY`-th round prices deferrals optimistically (``s = 1``) and drafts
long if that would pay (counted as ``rounds_explore``). Exact and rejection verification have no
loose rule: their choice is the exact-match chain alone, as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from loosespec.cost import CostCurve
from loosespec.drafters.base import EMPTY_DRAFT, Draft, Drafter

# Optimistic before any evidence (a new drafter is tried), worth one round of evidence: a drafter that
# does not pay is dropped after a round or two, and one that does is kept.
PRIOR_MEAN = 0.9  # conditional acceptance of position 1 before any evidence (free n-gram lookup)
# A draft model: with the committed int8 curves (results/bench/cpu/cost_*.json, draft token ~0.4 of a
# target step) 0.9 made the first round draft all 15 tokens, ~0.9 s for about one token on prompts where
# the draft disagrees at once (translation); 0.7 makes the first try 2 tokens long.
MODEL_PRIOR_MEAN = 0.7
PRIOR_WEIGHT = 1.0  # in rounds
DECAY = 0.97  # per round: evidence older than ~30 rounds fades towards the prior


class AcceptanceEstimate:
    """Per-position conditional acceptance ``a_i`` with forgetting, for positions 1..max_k."""

    def __init__(
        self, max_k: int, prior_mean: float = PRIOR_MEAN, prior_weight: float = PRIOR_WEIGHT, decay: float = DECAY
    ):
        self.max_k = max_k
        self.prior_mean = prior_mean
        self.prior_weight = prior_weight
        self.decay = decay
        self.hits = [0.0] * max_k  # position i (0-based) accepted, having been reached
        self.trials = [0.0] * max_k  # position i drafted and reached (every earlier position accepted)

    def rates(self, k: int | None = None) -> list[float]:
        """``a_1 .. a_k`` in one pass, each position's prior the estimate for the position before it."""
        out, prior = [], self.prior_mean
        for i in range(min(self.max_k if k is None else k, self.max_k)):
            prior = (self.hits[i] + prior * self.prior_weight) / (self.trials[i] + self.prior_weight)
            out.append(prior)
        return out

    def rate(self, i: int) -> float:
        """``a_{i+1}``: P(position i accepted | positions 0..i-1 accepted), 0-based i."""
        return self.rates(i + 1)[i]

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
        for a in self.rates(k):
            reach *= a
            total += reach
        return total


# a loose rule's deferral estimate (g, s): before evidence the gate is as likely open as not, worth one round. Its
# evidence fades slower than the acceptance estimate's (~100 rounds): what a window buys is seen only in long rounds
GATE_PRIOR_MEAN = 0.5
LOOSE_PRIOR_WEIGHT = 1.0
LOOSE_DECAY = 0.99
# while fewer than this many (decayed) rounds have shown whether a deferrable mismatch is kept, every EXPLORE_EVERY-th
# round prices deferrals as if every open gate were kept (see the module docstring). An exploration round counts
# towards that evidence whatever it showed, so where deferrals do not come, exploring settles at about one round in
# 40 (each adds 1, which fades back below 2 in about 40 rounds)
EXPLORE_EVIDENCE = 2.0
EXPLORE_EVERY = 8
# a draft model's catch-up on tokens it has not read (catch_up_s) is charged to a round's choice over this many rounds
CATCH_UP_ROUNDS = 4


class LoosePrices:
    """A loose rule's deferrals, learnt per round (see the module docstring): the gate-open rate ``g`` at a
    round's first native rejection and the share ``s`` of gate-open, deferrable first rejections the rule kept.

    ``window``, ``boundary`` and ``num_draft_tokens`` are the rule's (``fly_window_size``, ``fly_boundary``, K),
    so the policy knows where a draft of k tokens can defer.
    """

    def __init__(
        self,
        window: int,
        boundary: str = "window",
        num_draft_tokens: int | None = None,
        decay: float = LOOSE_DECAY,
        prior_weight: float = LOOSE_PRIOR_WEIGHT,
    ):
        self.window, self.boundary, self.num_draft_tokens = window, boundary, num_draft_tokens
        self.decay = decay
        self.prior_weight = prior_weight
        self.gate = [0.0, 0.0]  # [open, seen]
        self.kept = [0.0, 0.0]  # [kept, deferrable with the gate open]
        self.explored = 0.0  # exploration rounds (decayed), whatever they showed
        self._bounds: dict[int, list[bool]] = {0: []}

    def deferrable(self, k: int) -> list[bool]:
        """[k] where a draft of k tokens can defer: the rule's own boundary (one definition, the rule's)."""
        if k not in self._bounds:
            from loosespec.verify.fly import within_boundary

            self._bounds[k] = within_boundary(k, self.window, "cpu", self.num_draft_tokens, self.boundary).tolist()
        return self._bounds[k]

    def gate_rate(self) -> float:
        return (self.gate[0] + GATE_PRIOR_MEAN * self.prior_weight) / (self.gate[1] + self.prior_weight)

    def keep_rate(self, prior: float) -> float:
        return (self.kept[0] + prior * self.prior_weight) / (self.kept[1] + self.prior_weight)

    def thin(self) -> bool:
        """Whether ``s`` still rests on little evidence (exploration rounds price it optimistically). An exploration
        round counts as evidence whatever it showed: one whose first rejection fell where the window could not fit,
        or where the gate was shut, says deferrals are rare here, and exploring on would only cost long drafts."""
        return self.kept[1] + self.explored < EXPLORE_EVIDENCE

    def update(self, miss, explored: bool = False) -> None:
        """One round's first native rejection (:class:`~loosespec.verify.types.FirstMiss`, None: none);
        ``explored``: the round was an exploration."""
        for c in (self.gate, self.kept):
            c[0] *= self.decay
            c[1] *= self.decay
        self.explored = self.explored * self.decay + explored
        if miss is None:
            return
        self.gate[0] += miss.gate_open
        self.gate[1] += 1
        if miss.gate_open and miss.deferrable:
            self.kept[0] += miss.deferred
            self.kept[1] += 1

    def expected_tokens(self, rates: list[float], k: int, keep: float | None = None) -> float:
        """E(k) with deferrals: ``rates`` = a_1 .. a_k of exact (native) acceptance; ``keep``: s (default: the
        estimate, its prior the chance of W native acceptances in a row)."""
        w = self.window
        if keep is None:
            run = 1.0
            for a in rates[:w]:
                run *= a
            keep = self.keep_rate(run)
        defer = self.gate_rate() * keep
        ok = self.deferrable(k)
        reach = [0.0] * (k + w + 2)
        reach[0] = 1.0
        kept = 0.0
        for j in range(k):
            r = reach[j]
            if r <= 0.0:
                continue
            a = rates[j]
            kept += r * a
            reach[j + 1] += r * a
            if ok[j]:
                d = r * (1.0 - a) * defer
                kept += d * (w + 1)  # the deferred token and the W after it
                reach[j + w + 1] += d
        return 1.0 + kept


class DraftLengthPolicy:
    """Chooses a draft length from the cost curves and the acceptance estimate (and a loose rule's deferrals)."""

    def __init__(
        self,
        target_cost: CostCurve,
        draft_token_cost: float,
        max_k: int,
        estimate: AcceptanceEstimate | None = None,
        draft_cost_decay: float = 0.8,
        loose: LoosePrices | None = None,
    ):
        self.target_cost = target_cost
        self.draft_token_cost = draft_token_cost  # modelled seconds per drafted token (0 for n-gram lookup)
        self.max_k = max_k
        self.estimate = estimate or AcceptanceEstimate(max_k)
        self.draft_cost_decay = draft_cost_decay
        self.loose = loose
        self.rounds = 0
        self.explored = False  # the last best() was an exploration round

    def expected_tokens(self, k: int, keep: float | None = None) -> float:
        """E(k): committed tokens expected from a round drafting k (a loose rule's deferrals included)."""
        if self.loose is None or k == 0:
            return self.estimate.expected_tokens(k)
        return self.loose.expected_tokens(self.estimate.rates(k), k, keep)

    def expected_rate(self, k: int, keep: float | None = None, extra_s: float = 0.0) -> float:
        """Expected committed tokens per second of a round drafting k; ``extra_s``: what drafting at all costs this
        round beyond its tokens (a draft model catching up on tokens it has not read)."""
        return self.expected_tokens(k, keep) / (
            k * self.draft_token_cost + (extra_s if k else 0.0) + self.target_cost(k + 1)
        )

    def best(self, k_cap: int, extra_s: float = 0.0) -> tuple[int, float]:
        """The draft length in 0..k_cap with the highest expected rate, and that rate (``extra_s``: see
        :meth:`expected_rate`). With a loose rule whose keep rate rests on little evidence, every
        EXPLORE_EVERY-th call prices deferrals as if kept."""
        self.explored = False
        if self.loose is None:
            return self._best_exact(k_cap, extra_s)
        best_k, best = 0, self.expected_rate(0)
        for k in range(1, min(k_cap, self.max_k) + 1):
            r = self.expected_rate(k, None, extra_s)
            if r > best:
                best_k, best = k, r
        if self.loose.thin() and self.rounds % EXPLORE_EVERY == EXPLORE_EVERY - 1:
            top = min(k_cap, self.max_k)
            hopeful = max(range(best_k, top + 1), key=lambda k: self.expected_rate(k, 1.0, extra_s))
            # long enough that the first rejection, where it usually falls, leaves room for the window: a round that
            # can defer only at position 0 would seldom tell whether windows survive (a lookup proposal too short
            # for that does not explore)
            usual = int(math.ceil(self.estimate.expected_tokens(top) - 1))  # the native prefix's expectation
            if hopeful > best_k:  # optimism says a longer draft pays (never where the gate is seen shut)
                hopeful = max(hopeful, usual + self.loose.window + 1)
            if hopeful > best_k and hopeful <= top and any(self.loose.deferrable(hopeful)):
                self.explored = True  # priced as hoped, so that a level exploring wins the round
                return hopeful, self.expected_rate(hopeful, 1.0, extra_s)
        return best_k, best

    def _best_exact(self, k_cap: int, extra_s: float = 0.0) -> tuple[int, float]:
        best_k, best = 0, self.expected_rate(0)
        tokens, reach = 1.0, 1.0
        for k, a in enumerate(self.estimate.rates(k_cap), start=1):
            reach *= a
            tokens += reach  # E(k), built up position by position
            r = tokens / (k * self.draft_token_cost + extra_s + self.target_cost(k + 1))
            if r > best:
                best_k, best = k, r
        return best_k, best

    def observe(
        self, drafted: int, accepted: int, draft_seconds: float | None = None, first_miss=None, loose: bool = True
    ) -> None:
        """The round's outcome; ``draft_seconds``: the modelled cost of what was drafted; ``first_miss``: a loose
        rule's account of the first native rejection (:class:`~loosespec.verify.types.FirstMiss`), whose
        position is the native (exact-match) prefix the acceptance estimate learns from. ``loose``: also update
        the loose rule's estimate (a :class:`CostAwareDrafter` whose levels share one does that itself, once)."""
        self.rounds += 1
        native = first_miss.position if first_miss is not None else accepted
        self.estimate.update(drafted, native)
        if loose and self.loose is not None:
            self.loose.update(first_miss if drafted else None, bool(drafted) and self.explored)
        if drafted and draft_seconds is not None:
            a = self.draft_cost_decay
            self.draft_token_cost = a * self.draft_token_cost + (1 - a) * draft_seconds / drafted


def catch_up_s(lm, seq: torch.Tensor) -> float:
    """What a draft model must read before it can draft after ``seq``, in modelled seconds: the committed tokens
    its cache lacks beyond the last one (rounds drafted by another level, or none), priced as the extra tokens of
    its next forward. 0 for a free level, and for an empty cache (its prompt read is once per generation, like
    the target's prefill, and booked apart: ``CachedLM.modelled_prefill_s``)."""
    if lm is None or getattr(lm, "cost", None) is None or not len(getattr(lm, "ids", ())):
        return 0.0
    from loosespec.decode.kv import common_prefix_len

    lag = seq.shape[0] - common_prefix_len(lm.ids, seq)
    return max(lm.cost(lag) - lm.cost(1), 0.0) if lag > 1 else 0.0


@dataclass
class Level:
    """One way of drafting: its drafter, its own policy, and the draft model's
    :class:`~loosespec.decode.kv.CachedLM` whose ``modelled_s`` prices it (None: free, e.g. n-gram lookup)."""

    name: str  # "lookup" | "model"; the round's level is counted as ``rounds_<name>`` (or ``rounds_none``)
    drafter: object
    policy: DraftLengthPolicy
    lm: object | None = None


class CostAwareDrafter(Drafter):
    """Wraps one or more drafting levels: each round drafts the level and length that pay best, or nothing.

    A free level (no ``lm``) proposes first and is judged up to its proposal's length; a costly level
    (the draft model) proposes only when chosen. The level not used this round learns nothing and its
    evidence fades, so it is tried again later. With MLA's two levels, where lookup finds long copies
    (summaries, edits of code in the prompt) the draft model is not run at all.
    """

    def __init__(self, levels: list[Level]):
        self.levels = levels
        self.name = levels[-1].drafter.name
        self.level: Level | None = None
        self._draft_s: float | None = None

    def propose(self, seq: torch.Tensor, k: int) -> Draft:
        options = [(None, 0, self.levels[0].policy.expected_rate(0), None, 0.0)]  # no draft: a plain target step
        for level in self.levels:
            proposal = None
            if level.lm is None:
                proposal = level.drafter.propose(seq, k)
                if not len(proposal):
                    continue
            catch = catch_up_s(level.lm, seq)
            # a catch-up is paid once and serves the rounds after it: priced whole on one round, a draft model that
            # fell behind would never be worth catching up (and would fall further behind every round)
            options.append(
                (
                    level,
                    *level.policy.best(len(proposal) if proposal is not None else k, catch / CATCH_UP_ROUNDS),
                    proposal,
                    catch,
                )
            )
        level, chosen, _, proposal, catch = max(options, key=lambda o: o[2])  # ties keep the earlier, cheaper option
        if chosen == 0:
            level = None
        self.level, self._draft_s = level, None
        # what it chose travels on the draft: the length (the draft-length histogram) and the level (the counters)
        events = {f"rounds_{level.name if level else 'none'}": 1}
        if level is not None and level.policy.explored:
            events["rounds_explore"] = 1
        if level is None:
            return replace(EMPTY_DRAFT, chosen=0, events=events)
        if proposal is not None:
            return Draft(
                proposal.tokens[:chosen],
                None if proposal.probs is None else proposal.probs[:chosen],
                chosen=chosen,
                events=events,
            )
        before = level.lm.modelled_s
        draft = level.drafter.propose(seq, chosen)
        # what the drafted tokens cost, the catch-up taken out: one dear round must not make every later draft
        # token look as dear (it did: a draft model chosen once after 60 lookup rounds was never chosen again)
        self._draft_s = max(level.lm.modelled_s - before - catch, 0.0)
        return replace(draft, chosen=chosen, events=events)

    def feedback(self, drafted: int, accepted: int, first_miss=None) -> None:
        """The round's outcome: ``accepted`` of ``drafted`` kept; ``first_miss``: a loose rule's account of the
        first native rejection (:class:`~loosespec.verify.types.FirstMiss`)."""
        for level in self.levels:
            if level is self.level:
                level.policy.observe(drafted, accepted, self._draft_s, first_miss, loose=False)
            else:
                level.policy.observe(0, 0, loose=False)  # no evidence: older evidence fades, so it is tried again
        # a loose rule's estimate, once per round even where the levels share it
        for loose in {
            id(lv.policy.loose): lv.policy.loose for lv in self.levels if lv.policy.loose is not None
        }.values():
            mine = self.level is not None and loose is self.level.policy.loose
            loose.update(
                first_miss if mine and drafted else None, mine and bool(drafted) and self.level.policy.explored
            )
