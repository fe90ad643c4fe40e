"""Drafters: objects that propose up to ``k`` tokens to continue a sequence, and the table that builds them.

A drafter (:class:`~loosespec.drafters.base.Drafter`) has ``propose(seq, k) -> Draft`` and ``feedback(drafted,
accepted)`` (draft-model forwards are counted by the model's :class:`~loosespec.decode.kv.CachedLM`). Drafters
keep no hidden state that correctness depends on: a model drafter's KV cache is a memo (see
:mod:`loosespec.decode.kv`) and follows whatever sequence it is asked to continue.

:data:`DRAFTERS` is the drafter table: each drafter's name, one line of help, whether it drafts with the draft
model, its default draft length, the cost-aware draft length's level it counts as, and the factory that builds it
for a run (:class:`DraftParts`). Everything that needs to know about drafters reads it: the ``drafter`` knob
(:mod:`loosespec.config`), ``Engine.build``, the front ends deciding whether a draft model is needed, the bench's
method table. Besides :mod:`loosespec.methods`, this is the one module that names drafters (``tests/test_layout.py``
checks). It imports the drafters themselves lazily (in the factories, and on first use of ``NgramDrafter`` and the
others from this package), so that the configuration can read the table without loading them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the table is read by modules the drafters build on
    import torch

    from loosespec.decode.kv import CachedLM
    from loosespec.drafters.base import Drafter
    from loosespec.verify.sampling import SamplingParams


@dataclass(frozen=True)
class DraftParts:
    """What a drafter factory builds its drafter from (``Engine.build`` fills it)."""

    cfg: Any  # the run's loosespec.config.DecodeConfig (not imported, not even for types: config reads this table)
    lm: CachedLM | None  # the draft model (None: none loaded)
    sampling: SamplingParams  # the draft's sampling (the method's, :meth:`loosespec.methods.Method.draft_sampling`)
    generator: torch.Generator | None
    stop_ids: frozenset[int]  # end tokens in the target's ids (prompt lookup works in them)
    draft_stop_ids: frozenset[int]  # end tokens in the ids the draft model works in (its own across tokenizers)
    full_drafts: bool  # the method drafts the full K: no confidence stop (methods.Method.full_drafts)


@dataclass(frozen=True)
class DrafterEntry:
    """One drafter of the table."""

    name: str
    summary: str  # one line for --help
    needs_draft_model: bool  # drafts with the draft model (else free: prompt lookup)
    num_draft_tokens: int  # the draft length per round when --num-draft-tokens is not given
    level: str  # the cost-aware draft length's level its rounds count as (``rounds_<level>``)
    build: Callable[[DraftParts], Drafter]
    # drafters tried before it as cheaper levels of their own by the cost-aware draft length (MLA: the lookup
    # alone, or the draft model), when the draft shares the target's tokenizer
    levels: tuple[str, ...] = ()


def _ngram(p: DraftParts) -> Drafter:
    from loosespec.drafters.ngram import NgramDrafter

    return NgramDrafter(p.cfg.prompt_lookup_max, p.cfg.prompt_lookup_min, p.stop_ids)


def _model(p: DraftParts) -> Drafter:
    from loosespec.drafters.model import ModelDrafter

    # FLy drafts the full K, as its official code: no confidence stop (methods.Method.full_drafts)
    threshold = 0.0 if p.full_drafts else p.cfg.draft_confidence_threshold
    return ModelDrafter(p.lm, p.sampling, p.generator, p.draft_stop_ids, threshold)


def _mla(p: DraftParts) -> Drafter:
    from loosespec.drafters.mla import MlaDrafter

    return MlaDrafter(
        p.lm,
        p.sampling,
        p.generator,
        p.draft_stop_ids,
        max_ngram=4,
        lookup_tokens=p.cfg.mla_lookup_tokens,
        min_ngram=p.cfg.prompt_lookup_min,
    )


# Draft length per round when --num-draft-tokens is not given: PLD's 10 for n-gram lookup, FLy's K = 15 for MLA;
# 8 for a plain draft model (it stops earlier on low confidence anyway).
DRAFTERS: dict[str, DrafterEntry] = {
    d.name: d
    for d in (
        DrafterEntry(
            "ngram",
            "prompt lookup: copy what followed an earlier occurrence of the last n-gram",
            needs_draft_model=False,
            num_draft_tokens=10,
            level="lookup",
            build=_ngram,
        ),
        DrafterEntry(
            "model",
            "a small draft model, autoregressive",
            needs_draft_model=True,
            num_draft_tokens=8,
            level="model",
            build=_model,
        ),
        DrafterEntry(
            "mla",
            "draft model accelerated by n-gram lookup (FLy's multi-level acceleration)",
            needs_draft_model=True,
            num_draft_tokens=15,
            level="model",
            build=_mla,
            levels=("ngram",),
        ),
    )
}


def default_drafter(has_draft_model: bool) -> str:
    """The drafter a speculative method drafts with when none is named: ``mla`` with a draft model, ``ngram``
    without."""
    return "mla" if has_draft_model else "ngram"


def drafter_needs_draft_model(name: str | None) -> bool:
    """Whether the drafter ``name`` drafts with the draft model (False for None, no drafter, and an unknown name,
    which the configuration refuses)."""
    entry = DRAFTERS.get(name) if name is not None else None
    return entry is not None and entry.needs_draft_model


_LAZY = {
    "Draft": "loosespec.drafters.base",
    "Drafter": "loosespec.drafters.base",
    "NgramDrafter": "loosespec.drafters.ngram",
    "ngram_lookup": "loosespec.drafters.ngram",
    "ModelDrafter": "loosespec.drafters.model",
    "MlaDrafter": "loosespec.drafters.mla",
}

__all__ = ["DRAFTERS", "DrafterEntry", "DraftParts", "default_drafter", "drafter_needs_draft_model", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
