"""Prompt-lookup table tests."""

import pytest
import torch

from loosespec.drafters import NgramDrafter, ngram_lookup


def look(seq, max_ngram=3, num_tokens=10, min_ngram=1, stop_ids=()):
    return ngram_lookup(torch.tensor(seq), max_ngram, num_tokens, min_ngram, stop_ids).tolist()


def test_docstring_example():
    assert look([1, 2, 3, 4, 2, 3], num_tokens=3) == [4, 2, 3]
    # PLD asks for a full continuation: 10 tokens are not there after [2, 3]
    assert look([1, 2, 3, 4, 2, 3], num_tokens=10) == []


def test_windows_that_overlap_the_suffix_are_not_matches():
    # the official PLD / FLy search: [2, 1, 2] at 2 overlaps the suffix at 4; [1, 2] at 1 does not
    assert look([7, 1, 2, 1, 2, 1, 2], num_tokens=4) == [1, 2, 1, 2]
    # a window that ends right where the suffix begins is excluded too (i + n < L - n)
    assert look([5, 3, 3], max_ngram=1, num_tokens=1) == []  # [3] at 1 is followed by the suffix [3] itself


@pytest.mark.parametrize("seq,max_ngram,num_tokens,expected", [
    # official-code cases: the first window passing both conditions, longest n first
    ([1, 2, 3, 1, 2], 3, 3, [3, 1, 2]),          # [1, 2] at 0 ends before the suffix, 3 tokens follow it
    ([1, 2, 3, 1, 2], 3, 4, []),                 # ... but not 4
    ([1, 2, 3, 4, 1, 2], 3, 2, [3, 4]),
    ([1, 2, 3, 4, 1, 2], 3, 5, []),              # a full continuation of 5 is not there
    ([1, 2, 1, 2, 1, 2, 1, 2], 2, 2, [1, 2]),     # [1, 2] at 0 ends before the suffix at 6
    ([9, 1, 9, 1, 9, 1], 3, 2, [9, 1]),          # no 3-gram ends before the suffix; [9, 1] at 0 does
])
def test_official_pld_cases(seq, max_ngram, num_tokens, expected):
    assert look(seq, max_ngram=max_ngram, num_tokens=num_tokens) == expected


def test_longest_ngram_wins_over_earlier_shorter_match():
    # suffix [7, 8]: the 1-gram [8] first occurs at 1 (followed by 5), the 2-gram [7, 8] at 3 (followed by 6)
    assert look([0, 8, 5, 7, 8, 6, 9, 7, 8], num_tokens=2) == [6, 9]


def test_earliest_match_for_equal_length():
    # [1, 2] occurs at 0 (-> 3) and at 3 (-> 4); the earliest is used
    assert look([1, 2, 3, 1, 2, 4, 1, 2], max_ngram=2, num_tokens=1) == [3]


def test_num_tokens_caps_the_proposal():
    assert look([1, 2, 3, 4, 5, 1, 2], num_tokens=2) == [3, 4]


def test_no_match_gives_empty_draft():
    assert look([1, 2, 3, 4]) == []
    assert look([5]) == []
    assert look([]) == []


def test_never_past_eos():
    # continuation after [1, 2] is [3, EOS=9, 4, 5]: cut after the EOS
    assert look([1, 2, 3, 9, 4, 5, 1, 2], num_tokens=4, stop_ids={9}) == [3, 9]


def test_min_ngram_excludes_short_matches():
    assert look([4, 1, 5, 6, 1], min_ngram=2) == []
    assert look([4, 1, 5, 6, 1], min_ngram=1, num_tokens=3) == [5, 6, 1]


def test_zero_tokens_asked():
    assert look([1, 2, 1], num_tokens=0) == []


def test_drafter_wrapper():
    d = NgramDrafter(max_ngram=2).propose(torch.tensor([1, 2, 3, 1, 2]), 2)
    assert d.tokens.tolist() == [3, 1] and d.probs is None and len(d) == 2
