"""Acceptance rules as objects: ``(draft, target logits [K + 1, V]) -> Verdict``.

Each wraps one of the pure tensor functions of :mod:`loosespec.verify` with what a method's
configuration fixes (sampling parameters, FLy's knobs, the shared generator). The registry in
:mod:`loosespec.methods` says which rule each method uses; the decode loop only calls them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from loosespec.verify import SamplingParams, Verdict, greedy_verify, logits_to_probs, rejection_verify
from loosespec.verify.fly import PromptCopyGuard, fly_verify_greedy, fly_verify_rejection, fly_verify_two_sample

if TYPE_CHECKING:  # annotations only: drafters/ sits above verify/, which imports nothing above it at run time
    from loosespec.drafters.base import Draft


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


class FlyRule:
    """FLy loose verification (LOSSY): greedy, or one of the two sampling variants for T > 0; with
    ``copy_guard`` (:class:`loosespec.verify.fly.PromptCopyGuard`, a labeled variant), no deferral where the
    draft copies the request's prompt."""

    def __init__(self, theta: float, window_size: int, top_k: int, num_draft_tokens: int, fly_sampling: str,
                 sampling: SamplingParams, generator: torch.Generator | None,
                 copy_guard: PromptCopyGuard | None = None, boundary: str = "window"):
        self.sampling = sampling
        self.generator = generator
        self.variant = "greedy" if sampling.greedy else fly_sampling
        # the official boundary follows the nominal K even when a round drafts fewer (cost-aware length, end, budget)
        self.knobs = {"theta": theta, "window_size": window_size, "top_k": top_k,
                      "num_draft_tokens": num_draft_tokens, "boundary": boundary}
        self.copy_guard = copy_guard

    def __call__(self, draft: Draft, logits: torch.Tensor) -> Verdict:
        knobs = self.knobs
        if self.copy_guard is not None:
            knobs = {**knobs, "copy": self.copy_guard(draft.tokens).to(logits.device)}
        if self.variant == "greedy":
            return fly_verify_greedy(draft.tokens, logits, **knobs)
        p = logits_to_probs(logits, self.sampling)
        if self.variant == "two-sample":
            return fly_verify_two_sample(draft.tokens, logits, p, self.generator, **knobs)
        return fly_verify_rejection(draft.tokens, draft_probs(draft, p.shape[-1]), logits, p, self.generator,
                                    **knobs)
