"""Prompt lookup decoding (PLD): propose the tokens that followed an earlier copy of the suffix.

For ``n = max_ngram .. min_ngram``, scan the windows of ``n`` tokens left to right and take the
first one equal to the sequence's last ``n`` tokens that ends before that suffix begins, as the
original PLD (Saxena 2023, the function FLy's official code uses) does: a window that overlaps or
touches the suffix is the suffix sliding over itself. Propose up to ``num_tokens`` of the tokens
that follow it. No match: an empty draft (the round degrades to one plain target step; no filler
is invented). A proposal stops at the first end-of-sequence token it contains (that token
included, nothing after it).

One departure from PLD, as transformers' ``prompt_lookup_num_tokens`` does: a match followed by
fewer than ``num_tokens`` tokens proposes what there is, where PLD skips it. PLD asks a fixed 10;
here ``num_tokens`` is the round's draft length (up to FLy's K = 15, chosen per round by the
cost-aware draft length), and requiring that many leaves no draft where the copy is recent (a line
the output repeats): with PLD's rule, FLy with lookup accepted exactly as much as exact matching on
the default pair's two test prompts (mean accepted length 2.016 both,
``tests/decode/test_default_pair.py::test_fly_accepts_more_than_exact``).

For ``[7, 1, 2, 1, 2, 1, 2]`` with max_ngram 3 and 4 tokens wanted, transformers proposes
``[1, 2]`` (the 3-gram ``[2, 1, 2]`` overlapping the suffix), PLD and this function ``[1, 2, 1, 2]``
(the 2-gram ``[1, 2]`` at 1).

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
    """Up to ``num_tokens`` tokens after the first earlier copy of the longest suffix n-gram (PLD's windows)."""
    length = seq.shape[0]
    if num_tokens <= 0:
        return seq[:0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        last = length - 2 * n - 1  # a window at i qualifies when it ends before the suffix: i + n < length - n
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
