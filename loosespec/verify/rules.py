"""Acceptance rules as objects: ``(draft, target logits [K + 1, V]) -> Verdict``.

Each wraps one of the pure tensor functions of :mod:`loosespec.verify` with what a method's
configuration fixes (sampling parameters, FLy's parameters as a :class:`FlyParams`, the shared generator). The
registry in :mod:`loosespec.methods` says which rule each method uses; the decode loop only calls them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from loosespec.verify import SamplingParams, Verdict, greedy_verify, logits_to_probs, rejection_verify
from loosespec.verify.fly import PromptCopyGuard, fly_verify_greedy, fly_verify_rejection, fly_verify_two_sample
from loosespec.verify.types import Draft


class Rule(Protocol):
    """Decides one round: how much of the draft the target keeps, and the token it adds."""

    def __call__(self, draft: Draft, logits: torch.Tensor) -> Verdict: ...


class GreedyRule:
    """Exact match against the target's argmax (lossless)."""

    def __call__(self, draft: Draft, logits: torch.Tensor) -> Verdict:
        return greedy_verify(draft.tokens, logits)


def draft_probs(draft: Draft, width: int) -> torch.Tensor | None:
    """The draft's q, cut or zero-padded to the target's vocabulary width (same tokenizer,
    embedding matrices padded to different sizes)."""
    q = draft.probs
    if q is None or q.shape[-1] == width:
        return q
    return q[:, :width] if q.shape[-1] > width else torch.nn.functional.pad(q, (0, width - q.shape[-1]))


class RejectionRule:
    """Speculative sampling (lossless in distribution); with an empty draft, plain sampling."""

    def __init__(self, sampling: SamplingParams, generator: torch.Generator | None):
        self.sampling = sampling
        self.generator = generator

    def __call__(self, draft: Draft, logits: torch.Tensor) -> Verdict:
        p = logits_to_probs(logits, self.sampling)  # [K + 1, V]
        return rejection_verify(draft.tokens, draft_probs(draft, p.shape[-1]), p, self.generator)


@dataclass(frozen=True)
class FlyParams:
    """FLy's parameters for one run, as :func:`~loosespec.verify.fly.fly_verify_greedy` and the sampling variants
    take them (the knobs ``fly_entropy_threshold``, ``fly_window_size``, ``fly_entropy_top_k``, ``num_draft_tokens``
    and ``fly_boundary`` of :class:`loosespec.config.DecodeConfig`)."""

    theta: float  # entropy gate, nats
    window_size: int  # W: positions after a mismatch that must match
    top_k: int  # the entropy is over the target's top-k probabilities
    num_draft_tokens: int | None  # the nominal K the official boundary follows (None: the draft's length)
    boundary: str  # "window" | "official" (verify.fly.FLY_BOUNDARIES)


class FlyRule:
    """FLy loose verification (LOSSY): greedy, or one of the two sampling variants for T > 0 (``fly_sampling``:
    ``two-sample`` | ``rejection``); with ``copy_guard`` (:class:`loosespec.verify.fly.PromptCopyGuard`, a labeled
    variant), no deferral where the draft copies the request's prompt."""

    def __init__(
        self,
        params: FlyParams,
        fly_sampling: str,
        sampling: SamplingParams,
        generator: torch.Generator | None,
        copy_guard: PromptCopyGuard | None = None,
    ):
        self.params = params  # the official boundary follows the nominal K even when a round drafts fewer
        self.sampling = sampling
        self.generator = generator
        self.variant = "greedy" if sampling.greedy else fly_sampling
        self.copy_guard = copy_guard

    def __call__(self, draft: Draft, logits: torch.Tensor) -> Verdict:
        p = self.params
        copy = self.copy_guard(draft.tokens).to(logits.device) if self.copy_guard is not None else None
        kw = dict(
            theta=p.theta,
            window_size=p.window_size,
            top_k=p.top_k,
            num_draft_tokens=p.num_draft_tokens,
            copy=copy,
            boundary=p.boundary,
        )
        if self.variant == "greedy":
            return fly_verify_greedy(draft.tokens, logits, **kw)
        probs = logits_to_probs(logits, self.sampling)
        if self.variant == "two-sample":
            return fly_verify_two_sample(draft.tokens, logits, probs, self.generator, **kw)
        return fly_verify_rejection(
            draft.tokens, draft_probs(draft, probs.shape[-1]), logits, probs, self.generator, **kw
        )
