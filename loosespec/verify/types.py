"""The one result type every acceptance rule returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Verdict:
    """Outcome of one round: ``num_accepted`` draft tokens kept, then one correction-or-bonus token.

    ``tokens`` is ``d[0:num_accepted]`` followed by that target token, so
    ``len(tokens) == num_accepted + 1`` always. ``events`` holds a rule's own counters for the
    round (FLy's deferrals and rejects), summed into the run's statistics.
    """

    num_accepted: int
    tokens: torch.Tensor  # [num_accepted + 1] int64
    events: Mapping[str, int] = field(default_factory=dict)
