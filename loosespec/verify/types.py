"""The one result type every acceptance rule returns."""

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
