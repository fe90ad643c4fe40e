"""The one result type every acceptance rule returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verdict:
    """Outcome of one round: ``num_accepted`` draft tokens kept, then one correction-or-bonus token.

    ``tokens`` is ``d[0:num_accepted]`` followed by that target token, so
    ``len(tokens) == num_accepted + 1`` always.
    """

    num_accepted: int
    tokens: torch.Tensor  # [num_accepted + 1] int64
