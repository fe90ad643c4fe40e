"""Drafting across tokenizers (loosespec.bridge): text round trips at awkward boundaries, and
greedy exact verification keeping the target's own output with a draft of another vocabulary."""

from __future__ import annotations

import pytest
import torch

from loosespec import DecodeConfig
from loosespec.bridge import TokenizerBridge
from loosespec.errors import LoosespecError
from loosespec.models import list_models

from conftest import _loaded, make_tiny_tokenizer

# strings where byte-level tokenizers with and without merges split differently
CASES = [
    ("def add(a, b):\n", "    return a + b\n"),                  # code indentation
    ("x =", "        1    +     2   # spaces"),                    # whitespace runs
    ("The total is ", "12345.678 and 1,000,000"),               # numbers
    ("naïve ", "café, 東京 and emoji 🙂 done"),                    # Unicode, multi-byte characters
    ("def compu", "te_sum(values):\n    return sum(values)"),    # the boundary inside a word
    ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "Sure! Here"),  # special tokens as text
]


def ready(name: str) -> bool:
    return any(m.name == name and m.state == "ready" for m in list_models())


def tokenizer_pairs():
    """(target, draft) tokenizers with different vocabularies that are available here."""
    from transformers import AutoTokenizer

    from loosespec.models import resolve

    def load_tokenizer(name):
        return AutoTokenizer.from_pretrained(resolve(name, progress=False).path)

    pairs = []
    byte = make_tiny_tokenizer()
    if ready("smollm2-135m-instruct"):
        smol = load_tokenizer("smollm2-135m-instruct")
        pairs += [("smol<-bytes", smol, byte), ("bytes<-smol", byte, smol)]
        for other in ("gemma-3-270m", "qwen2.5-coder-1.5b-instruct"):
            if ready(other):
                t = load_tokenizer(other)
                pairs += [(f"{other}<-smol", t, smol), (f"smol<-{other}", smol, t)]
    return pairs


PAIRS = tokenizer_pairs()
pytestmark = pytest.mark.real_model


@pytest.fixture(params=PAIRS, ids=[p[0] for p in PAIRS])
def bridge(request):
    _, target, draft = request.param
    return TokenizerBridge(target, draft)


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("committed, proposal", CASES)
def test_proposal_round_trips_as_text(bridge, committed, proposal):
    target_ids = torch.tensor(enc(bridge.target, committed))
    draft_ids = bridge.to_draft(target_ids)
    # target -> draft keeps the text exactly
    assert bridge.draft.decode(draft_ids.tolist(), skip_special_tokens=False) == \
        bridge.target.decode(target_ids.tolist(), skip_special_tokens=False)
    # the draft's proposal, as the draft tokenizer would write it after the committed text
    full = enc(bridge.draft, bridge.draft.decode(draft_ids.tolist(), skip_special_tokens=False) + proposal)
    n = len(draft_ids)
    if full[:n] != draft_ids.tolist():  # the draft merges across the boundary: propose from its own split
        full = draft_ids.tolist() + enc(bridge.draft, proposal)
    out = bridge.to_target(target_ids, draft_ids, full[n:])
    assert bridge.target.decode(out, skip_special_tokens=False) == proposal
    # with a clean boundary the ids are the target tokenizer's own split of the whole text
    whole = enc(bridge.target, committed + proposal)
    if whole[:len(target_ids)] == target_ids.tolist():
        assert out == whole[len(target_ids):]


def test_half_a_character_is_held_back(bridge):
    target_ids = torch.tensor(enc(bridge.target, "city: "))
    draft_ids = bridge.to_draft(target_ids)
    full = enc(bridge.draft, bridge.draft.decode(draft_ids.tolist(), skip_special_tokens=False) + "東京")
    if full[:len(draft_ids)] != draft_ids.tolist():  # the space merges into the character
        full = draft_ids.tolist() + enc(bridge.draft, "東京")
    proposal = full[len(draft_ids):]
    assert len(proposal) >= 2 or len(bridge.draft.decode(proposal[:1])) == 2
    for cut in range(1, len(proposal) + 1):
        text = bridge.target.decode(bridge.to_target(target_ids, draft_ids, proposal[:cut]),
                                    skip_special_tokens=False)
        assert "\ufffd" not in text and "東京".startswith(text)


def test_empty_proposal(bridge):
    ids = torch.tensor(enc(bridge.target, "abc"))
    assert bridge.to_target(ids, bridge.to_draft(ids), []) == []


# --- generation ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cross_engine(tiny_dir):
    """SmolLM2-135M target (float32) with the tiny byte-level model as its draft: another vocabulary."""
    from loosespec.engine import Engine
    from loosespec.models import load

    return Engine(load("smollm2-135m-instruct", "float32", "cpu", progress=False), _loaded(tiny_dir / "target", "tiny"))


PROMPT = "Write a Python function that returns the sum of the squares of a list of numbers."


@pytest.mark.parametrize("drafter", ["model", "mla"])
def test_greedy_exact_across_tokenizers_equals_target_greedy(cross_engine, drafter):
    assert cross_engine.bridge is not None
    ar = cross_engine.generate(PROMPT, DecodeConfig.create("ar", max_new_tokens=40))
    r = cross_engine.generate(PROMPT, DecodeConfig.create("exact", drafter, has_draft_model=True, max_new_tokens=40))
    assert r.token_ids == ar.token_ids
    s = r.stats.to_dict()
    assert s["draft_units_drafted"] > 0 and s["drafted_tokens"] > 0  # draft units and target units both counted
    assert s["accepted_tokens"] <= s["drafted_tokens"]


def test_fly_across_tokenizers_runs_and_is_labeled(cross_engine):
    r = cross_engine.generate(PROMPT, DecodeConfig.create("fly", "mla", has_draft_model=True, max_new_tokens=24))
    assert r.config["lossy"] is True and 0 < r.stats.new_tokens <= 24


def test_what_a_text_bridge_cannot_do_is_refused(cross_engine):
    with pytest.raises(LoosespecError, match="different tokenizers.*rejection sampling"):
        cross_engine.generate(PROMPT, DecodeConfig.create("rejection", "model", has_draft_model=True,
                                                          temperature=0.7, max_new_tokens=4))
    with pytest.raises(LoosespecError, match="fly_sampling 'rejection'"):
        cross_engine.generate(PROMPT, DecodeConfig.create("fly", "mla", has_draft_model=True, temperature=0.7,
                                                          fly_sampling="rejection", max_new_tokens=4))
    # n-gram drafting never needs the draft model's vocabulary; FLy's two-sample drafts greedily
    r = cross_engine.generate(PROMPT, DecodeConfig.create("rejection", "ngram", temperature=0.7, max_new_tokens=8))
    assert r.stats.new_tokens > 0
    r = cross_engine.generate(PROMPT, DecodeConfig.create("fly", "mla", has_draft_model=True, temperature=0.7,
                                                          max_new_tokens=8))
    assert r.stats.new_tokens > 0


@pytest.mark.parametrize("on_reject", ["draft-assisted", "regenerate"])
def test_specguard_across_tokenizers(cross_engine, on_reject):
    """tau above 1: every step is the target's own, whatever the draft wrote in its vocabulary."""
    ar = cross_engine.generate(PROMPT, DecodeConfig.create("ar", max_new_tokens=24))
    cfg = DecodeConfig.create("specguard", None, has_draft_model=True, max_new_tokens=24, sg_tau=1.5,
                              sg_candidates=2, sg_on_reject=on_reject)
    r = cross_engine.generate(PROMPT, cfg)
    assert r.token_ids == ar.token_ids and r.stats.step_summary()["accepted_steps"] == 0
    # tau 0 accepts every drafted step: the output is the draft's text, re-encoded for the target
    r = cross_engine.generate(PROMPT, DecodeConfig.create("specguard", None, has_draft_model=True,
                                                          max_new_tokens=24, sg_tau=0.0, sg_candidates=2))
    assert r.stats.step_summary()["accepted_steps"] > 0 and 0 < r.stats.new_tokens <= 24


@pytest.mark.skipif(not ready("gemma-3-270m"), reason="gemma-3-270m not prepared (loosespec models pull gemma-3-270m)")
def test_gemma_drafts_for_smollm2_exactly():
    """A real draft of another family (262,144-token vocabulary) for SmolLM2 (49,152)."""
    from loosespec.engine import Engine

    e = Engine.load("smollm2-135m-instruct", "gemma-3-270m", dtype="float32", device="cpu", progress=False)
    ar = e.generate(PROMPT, DecodeConfig.create("ar", max_new_tokens=32))
    r = e.generate(PROMPT, DecodeConfig.create("exact", "model", has_draft_model=True, max_new_tokens=32))
    assert r.token_ids == ar.token_ids and r.stats.accepted_tokens > 0


@pytest.mark.default_pair
def test_smollm2_drafts_for_qwen_on_code():
    """SmolLM2-135M -> Qwen2.5-Coder-1.5B: a useful share of the draft is accepted on code."""
    from loosespec.engine import Engine

    e = Engine.load("qwen2.5-coder-1.5b-instruct", "smollm2-135m-instruct", dtype="bfloat16", progress=False)
    r = e.generate("Write a Python function is_prime(n) with a docstring.",
                   DecodeConfig.create("exact", "model", has_draft_model=True, max_new_tokens=96))
    assert r.stats.acceptance_rate > 0.2, r.stats.to_dict()
