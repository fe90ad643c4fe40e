"""Prompt lookup decoding (PLD): propose the tokens that followed an earlier copy of the suffix.

The search is the original PLD's (Saxena 2023, the function FLy's official code uses): for
``n = max_ngram .. min_ngram``, scan the windows of ``n`` tokens left to right and take the first
one equal to the sequence's last ``n`` tokens that (a) ends before that suffix begins (a window
that overlaps or touches the suffix is the suffix sliding over itself) and (b) is followed by a
full ``num_tokens`` tokens; propose those tokens. No match: an empty draft (the round degrades to
one plain target step; no filler is invented). A proposal stops at the first end-of-sequence
token it contains (that token included, nothing after it).

Where this departs from transformers' ``prompt_lookup_num_tokens`` (and vLLM's n-gram
proposer): they accept a match with fewer than ``num_tokens`` tokens after it (clipped at the
end of the sequence) and windows that overlap the suffix. For ``[7, 1, 2, 1, 2, 1, 2]`` with
max_ngram 3 and 4 tokens wanted, transformers proposes ``[1, 2]`` (the 3-gram ``[2, 1, 2]``
overlapping the suffix), PLD and this function ``[1, 2, 1, 2]`` (the 2-gram ``[1, 2]`` at 1). FLy's
accepted lengths were measured with PLD's search, so that is the one here.

Example: ``seq = [1, 2, 3, 4, 2, 3]``, max_ngram 3, 3 tokens wanted: ``[4, 2, 3]`` has no earlier
copy; ``[2, 3]`` occurs at position 1, followed by ``[4, 2, 3]`` -> proposal ``[4, 2, 3]``. With 10
tokens wanted there is no full continuation, so no proposal.
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
    """PLD's proposal: the ``num_tokens`` tokens after the first earlier copy of the longest suffix n-gram."""
    length = seq.shape[0]
    if num_tokens <= 0:
        return seq[:0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        # a window at i qualifies when it ends before the suffix (i + n < length - n) and is followed
        # by num_tokens tokens (i + n + num_tokens <= length)
        last = min(length - 2 * n - 1, length - n - num_tokens)
        if last < 0:
            continue
        windows = seq[: last + n].unfold(0, n, 1)  # [last + 1, n]: windows starting at 0 .. last
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
