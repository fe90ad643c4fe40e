"""Greedy exact-match rule on hand-built logits."""

import torch

from loosespec.verify import first_false, greedy_verify, match_mask, prefix_verdict

V = 10


def logits_for(argmaxes):
    """One row per argmax; the argmax gets 5.0, everything else 0."""
    z = torch.zeros(len(argmaxes), V)
    z[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 5.0
    return z


def test_accepts_prefix_then_corrects():
    d = torch.tensor([5, 7, 9, 2])
    z = logits_for([5, 7, 3, 8, 1])  # rows 0,1 match; row 2 wants 3
    v = greedy_verify(d, z)
    assert v.num_accepted == 2  # accepts 5, 7
    assert v.tokens.tolist() == [5, 7, 3]  # then the correction 3


def test_all_accepted_emits_bonus():
    d = torch.tensor([4, 4, 4])
    v = greedy_verify(d, logits_for([4, 4, 4, 6]))
    assert v.num_accepted == 3 and v.tokens.tolist() == [4, 4, 4, 6]  # bonus 6


def test_first_token_rejected():
    v = greedy_verify(torch.tensor([1, 2]), logits_for([3, 2, 2]))
    assert v.num_accepted == 0 and v.tokens.tolist() == [3]  # a later match does not count


def test_empty_draft_is_one_target_step():
    v = greedy_verify(torch.empty(0, dtype=torch.long), logits_for([8]))
    assert v.num_accepted == 0 and v.tokens.tolist() == [8]


def test_mask_and_prefix_compose():
    d = torch.tensor([1, 2, 3, 4])
    t = torch.tensor([1, 0, 3, 4, 9])
    assert match_mask(d, t).tolist() == [True, False, True, True]
    # a loose rule may flip position 1 to accepted; the prefix step then keeps 4 drafts + bonus
    v = prefix_verdict(torch.tensor([True, True, True, True]), d, t)
    assert v.tokens.tolist() == [1, 2, 3, 4, 9]


def test_first_false_table():
    cases = [([], 0), ([True], 1), ([False], 0), ([True, True, False, True], 2), ([True] * 5, 5)]
    for mask, n in cases:
        assert first_false(torch.tensor(mask, dtype=torch.bool)) == n, mask
