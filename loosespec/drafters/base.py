"""The proposal type and the drafter protocol."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:  # annotations only
    from loosespec.verify.types import FirstMiss


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


class Drafter(Protocol):
    """Proposes up to ``k`` tokens a round (:meth:`propose`) and hears how the round went (:meth:`feedback`).

    Subclass it to inherit the no-op :meth:`feedback` (the loop calls it after every round that drafted); a
    drafter that learns from outcomes (the cost-aware draft length) overrides it, as transformers'
    ``CandidateGenerator.update_candidate_strategy``. What the drafter chose travels on the :class:`Draft`
    (``chosen``, ``events``), never as attributes the loop would have to look for."""

    name: str

    def propose(self, seq: torch.Tensor, k: int) -> Draft:
        """Up to ``k`` tokens to follow ``seq`` ([L] int64, CPU)."""
        ...

    def feedback(self, drafted: int, accepted: int, first_miss: FirstMiss | None = None) -> None:
        """The round's outcome: ``accepted`` of the ``drafted`` tokens kept; ``first_miss``: a loose rule's
        account of the first native rejection (:class:`~loosespec.verify.types.FirstMiss`). Default: ignored."""
        return None
