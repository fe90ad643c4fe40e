"""Greedy exact-match verification (lossless): keep the longest prefix with ``d_j == argmax z_j``.

Worked example (K = 4)::

    draft         d = [5, 7, 9, 2]
    target argmax t = [5, 7, 3, 8, 1]   # K + 1 rows
    match mask      = [T, T, F, F]
    verdict         = 2 accepted, tokens [5, 7, 3]   # 3 is the correction

The rule is split into a mask and a prefix step so that loose rules (FLy) are mask transforms
composed with the same :func:`prefix_verdict`.
"""

from __future__ import annotations

import torch

from loosespec.verify.types import Verdict


def match_mask(draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> torch.Tensor:
    """``E_j = (d_j == t_j)`` for the K draft positions.

    draft_tokens:  [K]      int64
    target_tokens: [K + 1]  int64, the target's choice at each row (row K is the bonus row)
    returns:       [K]      bool
    """
    k = draft_tokens.shape[0]
    return draft_tokens == target_tokens[:k]


def first_false(mask: torch.Tensor) -> int:
    """Number of leading ``True`` entries of a 1-D bool mask (``len(mask)`` if all are True)."""
    if mask.numel() == 0:
        return 0
    return int(mask.to(torch.int64).cumprod(0).sum().item())


def prefix_verdict(accept: torch.Tensor, draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> Verdict:
    """Keep ``d[0:n]`` where ``n`` is the first False of ``accept``, then emit ``t_n``.

    accept:        [K]     bool, which draft positions the rule accepts
    draft_tokens:  [K]     int64
    target_tokens: [K + 1] int64, the token the target emits at each row (argmax or a sample)
    """
    n = first_false(accept)
    tokens = torch.cat([draft_tokens[:n].to(target_tokens.device), target_tokens[n : n + 1]])
    return Verdict(num_accepted=n, tokens=tokens)


def greedy_verify(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """Lossless greedy speculative verification.

    draft_tokens:  [K]         int64
    target_logits: [K + 1, V]  float
    """
    target_tokens = target_logits.argmax(dim=-1)  # [K + 1]
    draft_tokens = draft_tokens.to(target_tokens.device)
    return prefix_verdict(match_mask(draft_tokens, target_tokens), draft_tokens, target_tokens)
