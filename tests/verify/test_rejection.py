"""Rejection sampling: hand-built cases and a seeded statistical test of losslessness."""

import torch

from loosespec.verify import SamplingParams, logits_to_probs, rejection_verify


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_certain_target_accepts_and_rejects():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    # draft [1, 2]: p(1) = 1 at row 0, p(2) = 1 at row 1 -> both accepted, bonus 0
    v = rejection_verify(torch.tensor([1, 2]), None, p, gen())
    assert v.num_accepted == 2 and v.tokens.tolist() == [1, 2, 0]
    # draft [0, 2]: p(0) = 0 at row 0 -> rejected; correction must be 1 (all mass)
    v = rejection_verify(torch.tensor([0, 2]), None, p, gen())
    assert v.num_accepted == 0 and v.tokens.tolist() == [1]


def test_q_above_p_can_reject_and_residual_excludes_draft():
    p = torch.tensor([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    seen = set()
    for s in range(200):
        v = rejection_verify(torch.tensor([0]), q, p, gen(s))
        if v.num_accepted == 0:
            seen.add(int(v.tokens[0]))
    assert seen == {1}  # residual max(0, p - q) puts all mass on token 1


def _empirical_first_token(p_row, q_row, n=20000, seed=0):
    """Distribution of the first emitted token when the draft samples d ~ q and the rule verifies."""
    g = torch.Generator().manual_seed(seed)
    V = p_row.shape[0]
    counts = torch.zeros(V)
    p = torch.stack([p_row, torch.full((V,), 1.0 / V)])
    q = q_row.unsqueeze(0)
    for _ in range(n):
        d = torch.multinomial(q_row, 1, generator=g)
        v = rejection_verify(d, q, p, g)
        counts[int(v.tokens[0])] += 1
    return counts / n


def test_output_distribution_equals_target():
    # seeded; 20k draws: the standard error per cell is < 0.0036, the bound is > 4 sigma
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    q = torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3])
    emp = _empirical_first_token(p, q)
    assert torch.allclose(emp, p, atol=0.015), (emp, p)


def test_output_distribution_equals_target_with_deterministic_draft():
    # n-gram style: the draft always proposes token 3; q is one-hot
    p = torch.tensor([0.3, 0.3, 0.2, 0.2])
    g = torch.Generator().manual_seed(1)
    counts = torch.zeros(4)
    probs = torch.stack([p, torch.full((4,), 0.25)])
    for _ in range(20000):
        v = rejection_verify(torch.tensor([3]), None, probs, g)
        counts[int(v.tokens[0])] += 1
    assert torch.allclose(counts / 20000, p, atol=0.015)


def test_seeded_runs_reproduce():
    p = torch.softmax(torch.randn(5, 50, generator=gen(3)), -1)
    q = torch.softmax(torch.randn(4, 50, generator=gen(4)), -1)
    d = torch.tensor([1, 2, 3, 4])
    a = [rejection_verify(d, q, p, gen(7)).tokens.tolist() for _ in range(3)]
    assert a[0] == a[1] == a[2]


def test_logits_to_probs_greedy_is_one_hot():
    z = torch.tensor([[0.1, 3.0, 2.9]])
    assert logits_to_probs(z, SamplingParams(0.0)).tolist() == [[0.0, 1.0, 0.0]]


def test_logits_to_probs_temperature_top_k_top_p():
    z = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.allclose(logits_to_probs(z, SamplingParams(1.0)), torch.tensor([[0.5, 0.3, 0.15, 0.05]]), atol=1e-6)
    top2 = logits_to_probs(z, SamplingParams(1.0, top_k=2))
    assert torch.allclose(top2, torch.tensor([[0.625, 0.375, 0.0, 0.0]]), atol=1e-6)
    nucleus = logits_to_probs(z, SamplingParams(1.0, top_p=0.7))  # smallest set with mass >= 0.7: {0, 1}
    assert torch.allclose(nucleus, torch.tensor([[0.625, 0.375, 0.0, 0.0]]), atol=1e-6)
    hot = logits_to_probs(z, SamplingParams(0.5))  # p^2 renormalised
    expect = torch.tensor([0.25, 0.09, 0.0225, 0.0025])
    assert torch.allclose(hot, (expect / expect.sum()).unsqueeze(0), atol=1e-6)
