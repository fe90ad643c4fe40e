"""Lossless speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

Accept ``d_j`` with probability ``min(1, p_j(d_j) / q_j(d_j))``; at the first rejection sample the
correction from ``normalize(max(0, p_j - q_j))``; after a fully accepted draft sample the bonus
from ``p_K``. The emitted tokens are distributed exactly as the target's own samples.

A drafter with no distribution (n-gram lookup) proposes deterministically: ``q`` is one-hot, so
``d_j`` is accepted with probability ``p_j(d_j)`` and the correction is drawn from ``p_j`` with
``d_j`` removed.

Worked example (V = 3, K = 1, one-hot draft of token 0): ``p_0 = [0.6, 0.3, 0.1]``. Token 0 is
kept with probability 0.6; otherwise the correction is 1 or 2 with probabilities 0.75 and 0.25,
so ``P(emit 0) = 0.6``, ``P(1) = 0.4 * 0.75 = 0.3``, ``P(2) = 0.1``: exactly ``p_0``.

The rule is split like the greedy one: :func:`native_accept` is the per-position mask (each
position with its own uniform draw), :func:`next_token` draws the correction or bonus after the
prefix a mask keeps, so loose rules can transform the mask in between.
"""

from __future__ import annotations

import torch

from loosespec.verify.exact import first_false
from loosespec.verify.types import Verdict


def native_accept(
    draft_tokens: torch.Tensor,  # [K] int64, on target_probs' device
    draft_probs: torch.Tensor | None,  # [K, V] q, or None for a deterministic (one-hot) proposal
    target_probs: torch.Tensor,  # [K + 1, V] p, after the same temperature/top-k/top-p as q
    generator: torch.Generator | None,
    uniform: torch.Tensor | None = None,  # [K] the draws, when the caller makes them (vLLM's per-request seeds)
) -> torch.Tensor:
    """[K] bool: ``u_j < p_j(d_j) / q_j(d_j)`` with one uniform draw per position."""
    k = draft_tokens.shape[0]
    rows = torch.arange(k, device=target_probs.device)
    p_d = target_probs[rows, draft_tokens]
    q_d = draft_probs[rows, draft_tokens] if draft_probs is not None else torch.ones_like(p_d)
    u = torch.rand(k, generator=generator, device=target_probs.device) if uniform is None else uniform
    return u * q_d < p_d  # u < p/q without dividing by a tiny q


def next_token(
    n: int,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """[1]: the correction at rejected position ``n`` (from ``max(0, p - q)``) or, if ``n == K``, the bonus."""
    if n == draft_tokens.shape[0]:
        return torch.multinomial(target_probs[n], 1, generator=generator)
    q_n = (
        draft_probs[n]
        if draft_probs is not None
        else torch.nn.functional.one_hot(draft_tokens[n], target_probs.shape[-1]).to(target_probs.dtype)
    )
    residual = torch.clamp(target_probs[n] - q_n, min=0.0)
    total = residual.sum()
    # p == q up to rounding leaves no residual mass; p itself is then the exact distribution.
    dist = residual / total if total > 0 else target_probs[n]
    return torch.multinomial(dist, 1, generator=generator)


def rejection_verify(
    draft_tokens: torch.Tensor,  # [K] int64
    draft_probs: torch.Tensor | None,  # [K, V] q, or None for a deterministic (one-hot) proposal
    target_probs: torch.Tensor,  # [K + 1, V] p
    generator: torch.Generator | None,
) -> Verdict:
    device = target_probs.device
    draft_tokens = draft_tokens.to(device)
    draft_probs = draft_probs.to(device) if draft_probs is not None else None
    n = first_false(native_accept(draft_tokens, draft_probs, target_probs, generator))
    nxt = next_token(n, draft_tokens, draft_probs, target_probs, generator)
    return Verdict(num_accepted=n, tokens=torch.cat([draft_tokens[:n], nxt]))
