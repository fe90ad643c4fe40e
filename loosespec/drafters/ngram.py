"""Prompt lookup: propose the tokens that followed an earlier copy of the sequence's last n-gram.

Three searches are written down here, each named for the code it follows; they differ in which
earlier windows count as a copy and in how much continuation a match must have:

- ``fly`` (the official FLy code's search, what the ``ngram`` drafter and MLA use): for ``n = max_ngram ..
  min_ngram``, the first window of ``n`` tokens inside ``ids[:-n]`` (it may end right where the suffix
  begins) that equals the last ``n`` tokens; propose what follows it, up to ``num_tokens`` tokens,
  clipped at the end of the sequence.
- ``transformers`` (transformers' ``prompt_lookup_num_tokens``, ``PromptLookupCandidateGenerator``): the
  first window anywhere before the suffix itself, so also one overlapping the suffix; its continuation
  clipped at the end of the sequence (a match with nothing after it is skipped).
- ``pld`` (the strict reading used here before 2026-12-04): a window that ends before the suffix begins
  and is followed by a full ``num_tokens`` tokens.

Measured on the committed ``ar`` outputs of Spec-Bench (60), HumanEval (164) and GSM8K (100) by
``benchmarks/lookup_replay.py`` (``results/lookup_replay.txt``: exact verification replayed, K = 10):
``fly`` and ``transformers`` draft the same tokens per round there, ``pld`` fewer (0.2-0.5% less modelled
tokens/s). So the drafters use ``fly``; the other two stay here for that comparison and the table tests.

No match: an empty draft (the round degrades to one plain target step; no filler is invented). A
proposal stops at the first end-of-sequence token it contains (that token included, nothing after it).

The official FLy cases (max_ngram 4, 6 tokens wanted), which ``tests/drafters/test_ngram.py`` checks:

    sequence                    fly            transformers   pld
    [5, 1, 1, 1]                [1, 1]         [1]            []
    [7, 1, 2, 1, 2, 1, 2]       [1, 2, 1, 2]   [1, 2]         []
    [1, 2, 3, 4, 2, 3]          [4, 2, 3]      [4, 2, 3]      []
    [3, 1, 2, 3, 1, 2, 3, 1]    [2, 3, 1]      [2, 3, 1]      [2, 3, 1, 2, 3, 1]

(In the first, transformers takes the 2-gram ``[1, 1]`` at 1, which overlaps the suffix, and has one
token after it; the official search looks for it in ``ids[:-2] = [5, 1]``, finds only the 1-gram ``[1]``
at 1 and proposes the two tokens after it. pld finds no copy with 6 tokens after it in any.)
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from loosespec.drafters.base import Draft, Drafter

SEARCHES = ("fly", "transformers", "pld")


def _last_start(length: int, n: int, num_tokens: int, search: str) -> int:
    """The last start ``i`` of a window of ``n`` tokens that the search admits in a sequence of ``length``."""
    if search == "fly":
        return length - 2 * n  # the window lies in ids[:-n]: i + n <= length - n
    if search == "transformers":
        return length - n - 1  # any window but the suffix itself (which has nothing after it)
    return min(length - 2 * n - 1, length - n - num_tokens)  # pld: ends before the suffix, full continuation


def ngram_lookup(
    seq: torch.Tensor,  # [L] int64
    max_ngram: int,
    num_tokens: int,
    min_ngram: int = 1,
    stop_ids: Collection[int] = (),
    search: str = "fly",
) -> torch.Tensor:
    """Up to ``num_tokens`` tokens after the first earlier copy of the longest suffix n-gram (see the module
    docstring for the three searches)."""
    if search not in SEARCHES:
        raise ValueError(f"search must be one of {', '.join(SEARCHES)}, got {search!r}")
    length = seq.shape[0]
    if num_tokens <= 0:
        return seq[:0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        last = _last_start(length, n, num_tokens, search)
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


class NgramDrafter(Drafter):
    """Prompt lookup as a drafter (max_ngram 3 as transformers' and PLD's default, up to ``k`` tokens per round)."""

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, stop_ids: Collection[int] = (), search: str = "fly"):
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.stop_ids = frozenset(stop_ids)
        self.search = search

    def propose(self, seq: torch.Tensor, k: int) -> Draft:
        return Draft(ngram_lookup(seq, self.max_ngram, k, self.min_ngram, self.stop_ids, self.search))
