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
"""

from __future__ import annotations

import torch

from .exact import first_false
from .types import Verdict


def rejection_verify(
    draft_tokens: torch.Tensor,  # [K] int64
    draft_probs: torch.Tensor | None,  # [K, V] q, or None for a deterministic (one-hot) proposal
    target_probs: torch.Tensor,  # [K + 1, V] p, after the same temperature/top-k/top-p as q
    generator: torch.Generator | None,
) -> Verdict:
    device = target_probs.device
    k = draft_tokens.shape[0]
    draft_tokens = draft_tokens.to(device)
    rows = torch.arange(k, device=device)
    p_d = target_probs[rows, draft_tokens]  # [K]
    q_d = draft_probs[rows, draft_tokens].to(device) if draft_probs is not None else torch.ones_like(p_d)
    u = torch.rand(k, generator=generator, device=device)
    n = first_false(u * q_d < p_d)  # u < p/q without dividing by a tiny q
    if n < k:
        q_n = (
            draft_probs[n].to(device)
            if draft_probs is not None
            else torch.nn.functional.one_hot(draft_tokens[n], target_probs.shape[-1]).to(target_probs.dtype)
        )
        residual = torch.clamp(target_probs[n] - q_n, min=0.0)
        total = residual.sum()
        # p == q up to rounding leaves no residual mass; p itself is then the exact distribution.
        dist = residual / total if total > 0 else target_probs[n]
    else:
        dist = target_probs[k]
    nxt = torch.multinomial(dist, 1, generator=generator)
    return Verdict(num_accepted=n, tokens=torch.cat([draft_tokens[:n], nxt]))
