"""Drafting across tokenizers (loosespec.drafters.bridge): text round trips at awkward boundaries, greedy
exact verification keeping the target's own output with a draft of another vocabulary, and lossless
rejection sampling through the vocabularies' intersection (TLI)."""

from __future__ import annotations

import pytest
import torch
from conftest import _loaded, make_tiny_tokenizer

from loosespec import DecodeConfig
from loosespec.drafters.bridge import TokenizerBridge, VocabIntersection, token_bytes
from loosespec.models import list_models

# strings where byte-level tokenizers with and without merges split differently
CASES = [
    ("def add(a, b):\n", "    return a + b\n"),  # code indentation
    ("x =", "        1    +     2   # spaces"),  # whitespace runs
    ("The total is ", "12345.678 and 1,000,000"),  # numbers
    ("naïve ", "café, 東京 and emoji 🙂 done"),  # Unicode, multi-byte characters
    ("def compu", "te_sum(values):\n    return sum(values)"),  # the boundary inside a word
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
    assert bridge.draft.decode(draft_ids.tolist(), skip_special_tokens=False) == bridge.target.decode(
        target_ids.tolist(), skip_special_tokens=False
    )
    # the draft's proposal, as the draft tokenizer would write it after the committed text
    full = enc(bridge.draft, bridge.draft.decode(draft_ids.tolist(), skip_special_tokens=False) + proposal)
    n = len(draft_ids)
    if full[:n] != draft_ids.tolist():  # the draft merges across the boundary: propose from its own split
        full = draft_ids.tolist() + enc(bridge.draft, proposal)
    out = bridge.to_target(target_ids, draft_ids, full[n:])
    assert bridge.target.decode(out, skip_special_tokens=False) == proposal
    # with a clean boundary the ids are the target tokenizer's own split of the whole text
    whole = enc(bridge.target, committed + proposal)
    if whole[: len(target_ids)] == target_ids.tolist():
        assert out == whole[len(target_ids) :]


def test_half_a_character_is_held_back(bridge):
    target_ids = torch.tensor(enc(bridge.target, "city: "))
    draft_ids = bridge.to_draft(target_ids)
    full = enc(bridge.draft, bridge.draft.decode(draft_ids.tolist(), skip_special_tokens=False) + "東京")
    if full[: len(draft_ids)] != draft_ids.tolist():  # the space merges into the character
        full = draft_ids.tolist() + enc(bridge.draft, "東京")
    proposal = full[len(draft_ids) :]
    assert len(proposal) >= 2 or len(bridge.draft.decode(proposal[:1])) == 2
    for cut in range(1, len(proposal) + 1):
        text = bridge.target.decode(bridge.to_target(target_ids, draft_ids, proposal[:cut]), skip_special_tokens=False)
        assert "\ufffd" not in text and "東京".startswith(text)


def test_empty_proposal(bridge):
    ids = torch.tensor(enc(bridge.target, "abc"))
    assert bridge.to_target(ids, bridge.to_draft(ids), []) == []


# --- generation ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cross_engine(tiny_dir):
    """SmolLM2-135M target (float32) with the tiny byte-level model as its draft: another vocabulary."""
    from loosespec.decode.engine import Engine
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


def _recorded_drafts(engine, monkeypatch) -> list[tuple[list[int], list[int]]]:
    """(draft ids the draft model proposed, target ids the verifier got) for every TLI proposal."""
    seen = []
    inter = engine.intersection()
    real = type(inter).map_draft

    def recording(self, draft):
        out = real(self, draft)
        seen.append((draft.tokens.tolist(), out.tokens.tolist()))
        return out

    monkeypatch.setattr(type(inter), "map_draft", recording)
    return seen


def _assert_inside_the_intersection(engine, drafts):
    """Every token the verifier got is the target twin of a draft id in the intersection; a proposal is
    cut only at its first draft id without a twin (MLA's lookup part copies ids from the context)."""
    inter = engine.intersection()
    assert drafts and sum(len(mapped) for _, mapped in drafts) > 0
    for proposed, mapped in drafts:
        n = len(mapped)
        assert all(inter.draft_mask[d] for d in proposed[:n]), proposed
        assert mapped == [int(inter.to_target[d]) for d in proposed[:n]] and min(mapped, default=0) >= 0
        assert n == len(proposed) or not inter.draft_mask[proposed[n]]


@pytest.mark.parametrize("method, extra", [("rejection", {}), ("fly", {"fly_sampling": "rejection"})])
@pytest.mark.parametrize("drafter", ["model", "mla"])
def test_sampling_across_tokenizers_drafts_inside_the_intersection(cross_engine, method, extra, drafter, monkeypatch):
    drafts = _recorded_drafts(cross_engine, monkeypatch)
    cfg = DecodeConfig.create(method, drafter, has_draft_model=True, temperature=0.8, max_new_tokens=16, **extra)
    r = cross_engine.generate(PROMPT, cfg)
    s = r.stats.to_dict()
    assert 0 < r.stats.new_tokens <= 16 and s["draft_units_drafted"] > 0 and s["drafted_tokens"] > 0
    assert s["accepted_tokens"] <= s["drafted_tokens"] <= s["draft_units_drafted"]  # one target id per draft id
    # every drafted token was inside the intersection and came back as its target twin
    inter = cross_engine.intersection()
    assert 0 < len(inter) < inter.draft_mask.shape[0]  # a real partial intersection: the mask matters
    _assert_inside_the_intersection(cross_engine, drafts)
    assert s["drafted_tokens"] == sum(len(mapped) for _, mapped in drafts)


@pytest.fixture(scope="module")
def twin_engine(tiny_dir, tmp_path_factory):
    """The tiny target with a draft of another vocabulary that predicts like it: the tiny draft (the target
    plus 5% noise) behind a tokenizer with the byte tokens in reverse order, its embedding and output rows
    permuted to match. The intersection is every byte token, each under another id, so the draft's tokens
    are accepted as often as on the same tokenizer only if each maps to its true twin."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from loosespec.decode.engine import Engine

    target = _loaded(tiny_dir / "target", "tiny")
    vocab = {"<s>": 0, "</s>": 1, "<pad>": 2}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet(), reverse=True):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    target_vocab = target.tokenizer.get_vocab()
    rows = torch.tensor([target_vocab[t] for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])])
    model = AutoModelForCausalLM.from_pretrained(tiny_dir / "draft", dtype=torch.float32).eval()
    with torch.no_grad():  # draft id i gets the rows of its target twin
        model.model.embed_tokens.weight.copy_(model.model.embed_tokens.weight[rows].clone())
        model.lm_head.weight.copy_(model.lm_head.weight[rows].clone())
    path = tmp_path_factory.mktemp("twin-draft")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    engine = Engine(target, _loaded(path, "tiny-reversed-vocabulary"))
    assert engine.bridge is not None and not torch.equal(rows, torch.arange(len(rows)))
    return engine


@pytest.mark.parametrize("method, extra", [("rejection", {}), ("fly", {"fly_sampling": "rejection"})])
@pytest.mark.parametrize("drafter", ["model", "mla"])
def test_sampling_across_tokenizers_accepts_draft_tokens(twin_engine, method, extra, drafter, monkeypatch):
    """The accept path across vocabularies runs: draft tokens of another tokenizer, drawn inside the
    intersection and carried to their target twins, are accepted (here 27% to 61% of them; a draft mapped
    to the wrong twins would almost never be)."""
    drafts = _recorded_drafts(twin_engine, monkeypatch)
    # K every round: whether drafting pays on this CPU (the cost-aware length) is not what is tested here
    cfg = DecodeConfig.create(
        method, drafter, has_draft_model=True, temperature=0.8, max_new_tokens=32, adaptive_draft_length=False, **extra
    )
    r = twin_engine.generate(PROMPT, cfg)
    s = r.stats.to_dict()
    _assert_inside_the_intersection(twin_engine, drafts)
    assert any(t != d for proposed, mapped in drafts for d, t in zip(proposed, mapped))  # ids really differ
    assert s["accepted_tokens"] > 0 and s["accepted_tokens"] >= 0.1 * s["drafted_tokens"], s
    assert 0 < r.stats.new_tokens <= 32


def test_intersection_pairs_tokens_that_decode_alike(bridge):
    t_tok, d_tok = bridge.target, bridge.draft
    inter = VocabIntersection.between(t_tok, d_tok, len(t_tok), len(d_tok))
    assert len(inter) > 200  # at least the single bytes / characters every vocabulary has
    pairs = inter.draft_mask.nonzero().squeeze(-1).tolist()
    for d in pairs[:: max(1, len(pairs) // 500)]:  # a spread sample, decoded by each tokenizer's own decoder
        t = int(inter.to_target[d])
        want = d_tok.convert_tokens_to_string(d_tok.convert_ids_to_tokens([d]))
        assert t_tok.convert_tokens_to_string(t_tok.convert_ids_to_tokens([t])) == want, (d, t)
    for special in d_tok.all_special_ids:  # end tokens and the like never travel as drafted text
        assert special >= inter.to_target.shape[0] or not inter.draft_mask[special]
    # a word both vocabularies hold whole maps to its twin
    for word in (" the", " return", "def"):
        d, t = enc(d_tok, word), enc(t_tok, word)
        if len(d) == 1 and len(t) == 1:
            assert int(inter.to_target[d[0]]) == t[0]


@pytest.mark.skipif(
    not all(ready(n) for n in ("qwen2.5-coder-1.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m")),
    reason="needs the Qwen, SmolLM2 and Gemma models prepared",
)
@pytest.mark.slow  # docs/models.md figures (loading Gemma's 262k-token vocabulary): make test-full
def test_shared_vocabulary_sizes():
    """The figures docs/models.md quotes: how much of each embedded drafter's vocabulary Qwen2.5 shares."""
    from transformers import AutoTokenizer

    from loosespec.models import resolve

    def tok(name):
        return AutoTokenizer.from_pretrained(resolve(name, progress=False).path)

    qwen = tok("qwen2.5-coder-1.5b-instruct")
    for name, shared, size in (("smollm2-135m-instruct", 39234, 49152), ("gemma-3-270m", 96078, 262144)):
        d = tok(name)
        assert (len(VocabIntersection.between(qwen, d, len(qwen), len(d))), len(d)) == (shared, size), name


def test_token_bytes_reads_sentencepiece_pieces():
    class Fake:  # the three kinds of piece a sentencepiece-style vocabulary has
        all_special_ids = [0]
        added_tokens_decoder = {}
        backend_tokenizer = type(
            "B",
            (),
            {
                "to_str": staticmethod(
                    lambda: '{"decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}]}}'
                )
            },
        )

        @staticmethod
        def get_vocab():
            return {"<bos>": 0, "\u2581the": 1, "<0x0A>": 2, "東京": 3}

    assert token_bytes(Fake) == {1: b" the", 2: b"\n", 3: "東京".encode()}


def test_tli_rejection_sampling_is_lossless():
    """Draft q masked to the shared tokens and carried over to target ids: rejection sampling then emits
    exactly the target's p, accepting the draft with probability 1 - TV(p, q); a q carried to the wrong
    ids would not be lossless."""
    from loosespec.drafters.base import Draft
    from loosespec.verify.rejection import rejection_verify
    from loosespec.verify.sampling import SamplingParams, logits_to_probs, sample

    to_target = torch.tensor([3, 0, -1, 5, 1])  # draft id -> target id; draft id 2 has no twin
    inter = VocabIntersection(to_target, target_width=6)
    q = logits_to_probs(torch.tensor([[2.0, 1.0, 3.0, 0.5, 1.5]]), SamplingParams(1.0, vocab_mask=inter.draft_mask))
    assert q[0, 2] == 0 and torch.isclose(q.sum(), torch.tensor(1.0))
    p = torch.tensor([0.10, 0.05, 0.30, 0.25, 0.10, 0.20])
    target_probs = p.expand(2, 6).contiguous()
    g = torch.Generator().manual_seed(0)
    n = 20000
    counts, wrong = torch.zeros(6), torch.zeros(6)
    accepted = 0
    for _ in range(n):
        d = inter.map_draft(Draft(sample(q, g), q))
        src = to_target.tolist().index(int(d.tokens[0]))  # the draft id it came from
        assert d.probs is not None and torch.isclose(d.probs[0, int(d.tokens[0])], q[0, src])
        v = rejection_verify(d.tokens, d.probs, target_probs, g)
        counts[int(v.tokens[0])] += 1
        accepted += v.num_accepted
        wrong[int(rejection_verify(d.tokens, d.probs.roll(1, -1), target_probs, g).tokens[0])] += 1
    assert (counts / n - p).abs().max() < 0.012
    q_target = d.probs[0]
    assert abs(accepted / n - (1 - 0.5 * (p - q_target).abs().sum())) < 0.012  # E[min(1, p/q)] = 1 - TV
    assert (wrong / n - p).abs().max() > 0.03


@pytest.mark.parametrize("on_reject", ["draft-assisted", "regenerate"])
def test_specguard_across_tokenizers(cross_engine, on_reject):
    """tau above 1: every step is the target's own, whatever the draft wrote in its vocabulary. Every step is
    attempted (sg_steps always): the adaptive chooser, kept by the engine across these parametrizations, may
    otherwise let the target write every step of a 24-token answer and the bridge would go unused."""
    ar = cross_engine.generate(PROMPT, DecodeConfig.create("ar", max_new_tokens=24))
    sg = dict(has_draft_model=True, max_new_tokens=24, sg_candidates=2, sg_steps="always")
    cfg = DecodeConfig.create("specguard", None, sg_tau=1.5, sg_on_reject=on_reject, **sg)
    r = cross_engine.generate(PROMPT, cfg)
    assert r.token_ids == ar.token_ids and r.stats.step_summary()["accepted_steps"] == 0
    # tau 0 accepts every drafted step: the output is the draft's text, re-encoded for the target
    r = cross_engine.generate(
        PROMPT,
        DecodeConfig.create("specguard", None, sg_tau=0.0, sg_on_reject=on_reject, **sg),
    )
    assert r.stats.step_summary()["accepted_steps"] > 0 and 0 < r.stats.new_tokens <= 24


@pytest.mark.slow  # make test checks greedy exact across tokenizers on SmolLM2 with the tiny draft (above)
@pytest.mark.skipif(not ready("gemma-3-270m"), reason="gemma-3-270m not prepared (loosespec models pull gemma-3-270m)")
def test_gemma_drafts_for_smollm2_exactly():
    """A real draft of another family (262,144-token vocabulary) for SmolLM2 (49,152)."""
    from loosespec.decode.engine import Engine

    e = Engine.load("smollm2-135m-instruct", "gemma-3-270m", dtype="float32", device="cpu", progress=False)
    ar = e.generate(PROMPT, DecodeConfig.create("ar", max_new_tokens=32))
    # K every round: a 270M draft for a 135M target never pays, so the cost-aware length would not draft at all
    r = e.generate(
        PROMPT,
        DecodeConfig.create("exact", "model", has_draft_model=True, max_new_tokens=32, adaptive_draft_length=False),
    )
    assert r.token_ids == ar.token_ids and r.stats.accepted_tokens > 0


@pytest.mark.default_pair
def test_smollm2_drafts_for_qwen_on_code():
    """SmolLM2-135M -> Qwen2.5-Coder-1.5B: a useful share of the draft is accepted on code."""
    from loosespec.decode.engine import Engine

    e = Engine.load("qwen2.5-coder-1.5b-instruct", "smollm2-135m-instruct", dtype="bfloat16", progress=False)
    r = e.generate(
        "Write a Python function is_prime(n) with a docstring.",
        DecodeConfig.create("exact", "model", has_draft_model=True, max_new_tokens=96),
    )
    assert r.stats.acceptance_rate > 0.2, r.stats.to_dict()
