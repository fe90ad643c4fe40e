"""Prompt lookup decoding (PLD): propose the tokens that followed an earlier copy of the suffix.

For ``n = max_ngram .. min_ngram``: find the earliest earlier occurrence of the sequence's last
``n`` tokens and propose up to ``num_tokens`` tokens that followed it. No match: an empty draft
(the round degrades to one plain target step; no filler is invented). A proposal stops at the
first end-of-sequence token it contains (that token included, nothing after it).

Example: ``seq = [1, 2, 3, 4, 2, 3]``, max_ngram 3: ``[4, 2, 3]`` has no earlier copy; ``[2, 3]``
occurs at position 1, followed by ``[4, 2, 3]`` -> proposal ``[4, 2, 3]`` (num_tokens >= 3).
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from loosespec.drafters.base import Draft


def ngram_lookup(
    seq: torch.Tensor,  # [L] int64
    max_ngram: int,
    num_tokens: int,
    min_ngram: int = 1,
    stop_ids: Collection[int] = (),
) -> torch.Tensor:
    """Continuation of the earliest earlier match of the longest matching suffix n-gram; [<= num_tokens]."""
    length = seq.shape[0]
    if num_tokens <= 0:
        return seq[:0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        # windows starting at 0 .. L-n-1: each has at least one token after it
        windows = seq[: length - 1].unfold(0, n, 1)  # [L - n, n]
        hits = (windows == seq[length - n :]).all(dim=1).nonzero()
        if hits.numel() == 0:
            continue
        start = int(hits[0, 0]) + n
        proposal = seq[start : start + num_tokens]
        if stop_ids:
            is_stop = torch.isin(proposal, torch.tensor(list(stop_ids), dtype=proposal.dtype))
            stops = is_stop.nonzero()
            if stops.numel():
                proposal = proposal[: int(stops[0, 0]) + 1]
        return proposal
    return seq[:0]


class NgramDrafter:
    """Prompt lookup as a drafter (PLD defaults: max_ngram 3, up to ``k`` tokens per round)."""

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, stop_ids: Collection[int] = ()):
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.stop_ids = frozenset(stop_ids)

    def propose(self, seq: torch.Tensor, k: int) -> Draft:
        return Draft(ngram_lookup(seq, self.max_ngram, k, self.min_ngram, self.stop_ids))
