"""Drafters: objects that propose up to ``k`` tokens to continue a sequence.

A drafter has one method, ``propose(seq, k) -> Draft`` (draft-model forwards are counted by the
model's :class:`~loosespec.decode.kv.CachedLM`). Drafters keep no hidden state that correctness depends on:
a model drafter's KV cache is a memo (see :mod:`loosespec.decode.kv`) and follows whatever sequence it
is asked to continue.
"""

from loosespec.drafters.base import Draft, Drafter
from loosespec.drafters.mla import MlaDrafter
from loosespec.drafters.model import ModelDrafter
from loosespec.drafters.ngram import NgramDrafter, ngram_lookup

__all__ = ["Draft", "Drafter", "NgramDrafter", "ModelDrafter", "MlaDrafter", "ngram_lookup"]
