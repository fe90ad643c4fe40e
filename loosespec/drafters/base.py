"""The proposal type and the drafter protocol."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class Draft:
    """Proposed continuation.

    tokens: [K] int64 on the CPU (K may be 0: the round degrades to one target step)
    probs:  [K, V] the distribution each token was drawn from (``q`` in rejection sampling), or
            None when the proposal is deterministic (greedy drafting, n-gram lookup): one-hot q.
    draft_units: set by a cross-tokenizer drafter (loosespec.drafters.bridge): the proposal's length in the
            draft model's own tokens, before re-encoding into the target's.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    draft_units: int | None = None  # across tokenizers: tokens the draft model proposed, in its own units

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


EMPTY_DRAFT = Draft(torch.empty(0, dtype=torch.long))


class Drafter(Protocol):
    name: str

    def propose(self, seq: torch.Tensor, k: int) -> Draft:
        """Up to ``k`` tokens to follow ``seq`` ([L] int64, CPU)."""
        ...
