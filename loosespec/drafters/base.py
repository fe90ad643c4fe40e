"""The drafter protocol; the proposal it returns, :class:`Draft`, is one of the types the rules read
(:mod:`loosespec.verify.types`, the ground floor) and is re-exported here."""

from __future__ import annotations

from typing import Protocol

import torch

from loosespec.verify.types import EMPTY_DRAFT, Draft, FirstMiss

__all__ = ["Draft", "Drafter", "EMPTY_DRAFT"]


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
