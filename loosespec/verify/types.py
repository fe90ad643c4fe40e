"""What an acceptance rule reads and returns: the proposal (:class:`Draft`) and the outcome (:class:`Verdict`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class FirstMiss:
    """Where a round's native verification first rejected, and what a loose rule made of it there: what the
    cost-aware draft length (:mod:`loosespec.decode.draftlen`) learns a loose rule's value from.

    ``position``: draft tokens natively accepted before it (exact matches when greedy); ``gate_open``: the
    target was uncertain enough there to defer; ``deferrable``: the draft was long enough for the rule to
    defer there (its window fits, the boundary); ``deferred``: the rule kept the draft token.
    """

    position: int
    gate_open: bool
    deferrable: bool
    deferred: bool


@dataclass(frozen=True)
class Verdict:
    """Outcome of one round: ``num_accepted`` draft tokens kept, then one correction-or-bonus token.

    ``tokens`` is ``d[0:num_accepted]`` followed by that target token, so
    ``len(tokens) == num_accepted + 1`` always. ``events`` holds a rule's own counters for the
    round (FLy's deferrals and rejects), summed into the run's statistics. ``first_miss``: a loose
    rule's account of the first native rejection (:class:`FirstMiss`; None from the lossless rules, whose
    first rejection ends the round, and when nothing was rejected).
    """

    num_accepted: int
    tokens: torch.Tensor  # [num_accepted + 1] int64
    events: Mapping[str, int] = field(default_factory=dict)
    first_miss: FirstMiss | None = None


@dataclass(frozen=True)
class Draft:
    """Proposed continuation.

    tokens: [K] int64 on the CPU (K may be 0: the round degrades to one target step)
    probs:  [K, V] the distribution each token was drawn from (``q`` in rejection sampling), or
            None when the proposal is deterministic (greedy drafting, n-gram lookup): one-hot q.
    draft_units: set by a cross-tokenizer drafter (loosespec.drafters.bridge): the proposal's length in the
            draft model's own tokens, before re-encoding into the target's.
    chosen: the draft length the drafter chose this round, when it chooses one (the cost-aware draft length,
            :class:`loosespec.decode.draftlen.CostAwareDrafter`; the draft may be shorter, cut at an end token or
            a doubtful draft token); None: it drafted up to the ``k`` asked for. Recorded in the run's
            draft-length histogram.
    events: counters of how the drafter drafted this round (the cost-aware draft length's level,
            ``rounds_lookup``/``rounds_model``/``rounds_none``, and ``rounds_explore``), summed into the run's
            statistics with the rule's.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    draft_units: int | None = None  # across tokenizers: tokens the draft model proposed, in its own units
    chosen: int | None = None
    events: Mapping[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


EMPTY_DRAFT = Draft(torch.empty(0, dtype=torch.long))
