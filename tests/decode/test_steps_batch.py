"""SpecGuard's candidates drafted as one batch: each is what drafting it alone gives for the same tokens,
at one draft forward per position for all of them."""

from __future__ import annotations

import torch

from loosespec.config import DecodeConfig
from loosespec.decode.steps import draft_candidate, draft_candidates

SEQ = torch.tensor([5, 6, 7, 8, 9, 10, 11], dtype=torch.long)


def alone(lm, tokens):
    """Teacher-forced: the draft's log-probs of ``tokens`` after SEQ and the mean state at them."""
    full = torch.cat([SEQ, torch.tensor(tokens, dtype=torch.long)])
    with torch.no_grad():
        out = lm.model(full[None], output_hidden_states=True)
    logits = out.logits[0, len(SEQ) - 1 : -1].float()
    lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]
    return lp, out.hidden_states[-1][0, len(SEQ) :].float().mean(0)


def test_batched_candidates_are_the_candidates_drafted_alone(tiny_engine):
    lm = tiny_engine.draft_lm
    lm.reset()
    g = torch.Generator().manual_seed(0)
    cands = draft_candidates(lm, SEQ, 4, 12, 0.9, g, lambda t: False)
    assert [len(c.tokens) for c in cands] == [12] * 4
    greedy = draft_candidate(lm, SEQ, 12, 0.0, None, lambda t: False)
    assert cands[0].tokens == greedy.tokens  # the first candidate is the greedy one
    assert len({tuple(c.tokens) for c in cands[1:]}) > 1  # the others are sampled
    for c in cands:
        lp, hidden = alone(lm, c.tokens)
        assert torch.allclose(c.logprobs, lp, atol=1e-4)
        assert torch.allclose(c.hidden, hidden, atol=1e-4)  # the mean state at the candidate's own tokens


def test_rows_that_stop_early_keep_their_own_tokens_and_states(tiny_engine):
    lm = tiny_engine.draft_lm
    lm.reset()
    g = torch.Generator().manual_seed(1)

    def done(tokens):  # stop each candidate after a different number of tokens, by its first token's parity
        return len(tokens) >= (2 if tokens[0] % 2 else 5)

    before = lm.forwards
    cands = draft_candidates(lm, SEQ, 4, 12, 1.5, g, done)
    used = lm.forwards - before
    for c in cands:
        assert len(c.tokens) == (2 if c.tokens[0] % 2 else 5)
        lp, hidden = alone(lm, c.tokens)
        assert torch.allclose(c.logprobs, lp, atol=1e-4) and torch.allclose(c.hidden, hidden, atol=1e-4)
    # one forward for the context, then one per position of the longest candidate
    assert used == 1 + max(len(c.tokens) for c in cands)


def test_specguard_drafts_with_fewer_forwards_batched(tiny_engine):
    base = dict(max_new_tokens=24, sg_candidates=4, sg_max_step_tokens=6, sg_tau=0.0, seed=0, sg_steps="always")
    forwards = {}
    for batched in (True, False):
        cfg = DecodeConfig.create("specguard", None, has_draft_model=True, sg_batch_candidates=batched, **base)
        r = tiny_engine.generate("Question: what is 2 + 2?", cfg)
        assert r.stats.to_dict()["steps"] >= 2
        forwards[batched] = r.stats.draft_forwards / r.stats.to_dict()["candidates_drafted"]
    assert forwards[True] < forwards[False] / 2
