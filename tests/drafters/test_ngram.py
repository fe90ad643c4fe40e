"""Prompt-lookup table tests: the official FLy search (the default), transformers' and the strict PLD reading."""

import pytest
import torch

from loosespec.drafters import NgramDrafter, ngram_lookup


def look(seq, max_ngram=3, num_tokens=10, min_ngram=1, stop_ids=(), search="fly"):
    return ngram_lookup(
        torch.tensor(seq, dtype=torch.long), max_ngram, num_tokens, min_ngram, stop_ids, search
    ).tolist()


# the official FLy code's cases (max n-gram 4, 6 tokens wanted), as issue 41 lists them, and the other two searches
@pytest.mark.parametrize(
    "seq,fly,transformers,pld",
    [
        ([5, 1, 1, 1], [1, 1], [1], []),
        ([7, 1, 2, 1, 2, 1, 2], [1, 2, 1, 2], [1, 2], []),
        ([1, 2, 3, 4, 2, 3], [4, 2, 3], [4, 2, 3], []),
        ([3, 1, 2, 3, 1, 2, 3, 1], [2, 3, 1], [2, 3, 1], [2, 3, 1, 2, 3, 1]),
    ],
)
def test_official_fly_cases(seq, fly, transformers, pld):
    assert look(seq, max_ngram=4, num_tokens=6) == fly
    assert look(seq, max_ngram=4, num_tokens=6, search="transformers") == transformers
    assert look(seq, max_ngram=4, num_tokens=6, search="pld") == pld


def test_fly_search_looks_in_ids_without_the_suffix_and_clips_the_continuation():
    # [2, 3] is searched in ids[:-2] = [1, 2, 3, 4]: at 1, followed by 4 2 3 (clipped at the end of the sequence)
    assert look([1, 2, 3, 4, 2, 3], num_tokens=10) == [4, 2, 3]
    # a match may end right where the suffix begins: [3] in [5, 3] at 1 -> the suffix's own token
    assert look([5, 3, 3], max_ngram=1, num_tokens=4) == [3]
    assert look([5, 3, 3], max_ngram=1, num_tokens=4, search="pld") == []  # strict: must end before, full tail


def test_transformers_search_matches_transformers_prompt_lookup():
    """transformers' PromptLookupCandidateGenerator on the same ids proposes what search="transformers" does."""
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        seq = torch.randint(0, 4, (int(torch.randint(2, 14, (1,), generator=g)),), generator=g)
        gen = PromptLookupCandidateGenerator(num_output_tokens=5, max_matching_ngram_size=3, max_length=1000)
        cand, _ = gen.get_candidates(seq.unsqueeze(0))
        theirs = cand[0, seq.shape[0] :].tolist()
        assert look(seq.tolist(), max_ngram=3, num_tokens=5, search="transformers") == theirs, seq.tolist()


@pytest.mark.parametrize("search", ["fly", "transformers", "pld"])
def test_longest_ngram_wins_over_earlier_shorter_match(search):
    # suffix [7, 8]: the 1-gram [8] first occurs at 1 (followed by 5), the 2-gram [7, 8] at 3 (followed by 6 9 ...)
    assert look([0, 8, 5, 7, 8, 6, 9, 7, 8], num_tokens=2, search=search) == [6, 9]


@pytest.mark.parametrize("search", ["fly", "transformers", "pld"])
def test_earliest_match_for_equal_length(search):
    # [1, 2] occurs at 0 (-> 3) and at 3 (-> 4); the earliest is used
    assert look([1, 2, 3, 1, 2, 4, 1, 2], max_ngram=2, num_tokens=1, search=search) == [3]


def test_num_tokens_caps_the_proposal():
    assert look([1, 2, 3, 4, 5, 1, 2], num_tokens=2) == [3, 4]


@pytest.mark.parametrize("search", ["fly", "transformers", "pld"])
def test_no_match_gives_empty_draft(search):
    assert look([1, 2, 3, 4], search=search) == []
    assert look([5], search=search) == []
    assert look([], search=search) == []


def test_never_past_eos():
    # continuation after [1, 2] is [3, EOS=9, 4, 5]: cut after the EOS
    assert look([1, 2, 3, 9, 4, 5, 1, 2], num_tokens=4, stop_ids={9}) == [3, 9]


def test_min_ngram_excludes_short_matches():
    assert look([4, 1, 5, 6, 1], min_ngram=2) == []
    assert look([4, 1, 5, 6, 1], min_ngram=1, num_tokens=3) == [5, 6, 1]


def test_zero_tokens_asked():
    assert look([1, 2, 1], num_tokens=0) == []


def test_unknown_search_is_refused():
    with pytest.raises(ValueError, match="search must be one of"):
        look([1, 2, 1], search="vllm")


def test_drafter_wrapper():
    d = NgramDrafter(max_ngram=2).propose(torch.tensor([1, 2, 3, 1, 2]), 2)
    assert d.tokens.tolist() == [3, 1] and d.probs is None and len(d) == 2
