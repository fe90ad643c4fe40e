"""The llama.cpp forward (--quantize int4): its cache bookkeeping against a fake llama.cpp context and the draft's
precision rule (always run); on a real GGUF where llama-cpp-python is installed (``make peers``), ``exact`` equal to
``ar`` token for token with the draft in int4, and an int4 target that runs."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import pytest
import torch

from loosespec.decode import gguf
from loosespec.decode.gguf import GgufLM, GgufModel
from loosespec.errors import LoosespecError

V = 7


def reference(prefix: list[int]) -> list[float]:
    """The fake model's logits after ``prefix``: a function of every id in it."""
    h = 0
    for t in prefix:
        h = (h * 31 + t + 1) % 1000003
    return [float((h >> i) % 97) for i in range(V)]


class FakeContext:
    """llama.cpp's context as GgufLM uses it: decode a batch at given positions, keep a cache, drop ranges."""

    def __init__(self):
        self.cache: list[int] = []
        self.fed: list[int] = []  # how many positions each decode call carried
        self.out: dict[int, ctypes.Array] = {}

    def kv_cache_clear(self):
        self.cache = []

    def kv_cache_seq_rm(self, seq_id, p0, p1):
        assert seq_id == 0 and p1 == -1
        del self.cache[p0:]
        return True

    def decode(self, batch_wrapper):
        b = batch_wrapper.batch
        self.out = {}
        for j in range(b.n_tokens):
            assert b.pos[j] == len(self.cache), "positions must continue the cache"
            assert b.seq_id[j][0] == 0 and b.n_seq_id[j] == 1
            self.cache.append(b.token[j])
            if b.logits[j]:
                self.out[j] = (ctypes.c_float * V)(*reference(self.cache))
        self.fed.append(b.n_tokens)

    def get_logits_ith(self, i):
        return self.out[i]


class FakeLM(GgufLM):
    def _open(self, model, n_ctx):
        n = gguf.N_BATCH
        batch = SimpleNamespace(
            n_tokens=0, token=[0] * n, pos=[0] * n, seq_id=[[0] for _ in range(n)], n_seq_id=[0] * n, logits=[False] * n
        )
        return FakeContext(), SimpleNamespace(batch=batch), V, n_ctx


@pytest.fixture
def lm(monkeypatch):
    monkeypatch.setattr(gguf, "N_BATCH", 8)
    return FakeLM(GgufModel("none.gguf", SimpleNamespace(vocab_size=V)), threads=1, n_ctx=64)


def rows_of(seq: list[int], rows: int) -> torch.Tensor:
    return torch.tensor([reference(seq[: len(seq) - rows + i + 1]) for i in range(rows)])


def test_verify_rows_and_rollback(lm):
    seq = list(range(3, 14))  # 11 ids: fed in chunks of at most 8, the rows asked for in the last one
    out = lm.logits(torch.tensor(seq), rows=6)
    assert torch.equal(out, rows_of(seq, 6))
    assert lm._ctx.fed == [3, 8] and lm._ctx.cache == seq
    # a rejected draft: the next sequence shares 9 ids; only the rest is fed, after a rollback
    nxt = seq[:9] + [40, 41, 42]
    assert torch.equal(lm.logits(torch.tensor(nxt), rows=3), rows_of(nxt, 3))
    assert lm._ctx.fed[-1] == 3 and lm._ctx.cache == nxt
    # the same sequence again with more rows: the cache keeps what it can and recomputes the rows asked for
    assert torch.equal(lm.logits(torch.tensor(nxt), rows=5), rows_of(nxt, 5))
    assert lm._ctx.fed[-1] == 5 and lm.forwards == 3


def test_prefill_and_refusals(lm):
    seq = torch.arange(20, 40)
    lm.prefill(seq)
    lm.prefill(seq)  # held already: no forward
    assert lm.forwards == 1 and lm._ctx.cache == seq.tolist()
    with pytest.raises(LoosespecError, match="exceeds the llama.cpp context"):
        lm.logits(torch.arange(65), rows=1)
    with pytest.raises(LoosespecError, match="rows must be"):
        lm.logits(torch.arange(12), rows=9)
    lm.reset()
    assert lm._ctx.cache == [] and lm.ids.numel() == 0


def test_gguf_model_refuses_transformers_calls():
    m = GgufModel("none.gguf", SimpleNamespace(vocab_size=V))
    assert next(m.parameters()).dtype == torch.float32 and m.get_output_embeddings().out_features == V
    for call in (m, m.generate):
        with pytest.raises(LoosespecError, match="llama.cpp"):
            call(torch.zeros(1, 1, dtype=torch.long))


def test_the_drafts_quantize_follows_an_explicit_target_choice():
    from loosespec.decode.engine import draft_quantize_for

    assert draft_quantize_for("auto", "auto") == "auto"  # resolved for the draft's role: int4 where it can
    assert draft_quantize_for("int8", "auto") == "int8"  # a run pinned to int8 keeps its draft in int8
    assert draft_quantize_for("int8", "int4") == "int4"  # unless told otherwise


def test_a_draft_that_transformers_runs_is_never_put_in_llamacpp_by_auto():
    from loosespec.decode.engine import draft_role
    from loosespec.hardware import resolve_precision

    kw = dict(engine="x86", gguf=True, llamacpp=True)
    assert resolve_precision("auto", "auto", "cpu", role=draft_role(False), **kw).name == "int4"
    assert resolve_precision("auto", "auto", "cpu", role=draft_role(True), **kw).name != "int4"


needs_llama = pytest.mark.skipif(not gguf.available(), reason="llama-cpp-python not installed (make peers)")


@needs_llama
def test_an_int4_draft_leaves_exact_equal_to_ar():
    """What --quantize auto gives where llama.cpp is installed: the draft in llama.cpp, the target batch-invariant.
    The draft's rounding changes what it proposes, never what the target accepts."""
    from loosespec import DecodeConfig, Engine

    eng = Engine.load(
        "smollm2-135m-instruct", draft="smollm2-135m-instruct", quantize="int8", draft_quantize="int4", progress=False
    )
    assert (eng.target.precision.name, eng.draft.precision.name) == ("int8", "int4")
    prompt = "Repeat this sentence three times: the cache holds the ids it was computed on, and no others."
    ar = eng.generate(prompt, DecodeConfig.create("ar", max_new_tokens=64))
    ex = eng.generate(
        prompt,
        DecodeConfig.create(
            "exact", drafter="model", num_draft_tokens=8, max_new_tokens=64, adaptive_draft_length=False
        ),
    )  # every round drafts and verifies
    assert ex.token_ids == ar.token_ids
    assert ex.stats.draft_forwards > 0 and ex.stats.accepted_tokens > 0
    assert ex.config["draft_precision"]["name"] == "int4"


@needs_llama
def test_an_int4_target_decodes_and_says_so():
    """--quantize int4 for the target: llama.cpp's forward, batch-variant (benchmarks/forward_cost.py), so nothing
    here asks exact to equal ar; it must run, verify drafts and record its precision."""
    from loosespec import DecodeConfig, Engine

    eng = Engine.load("smollm2-135m-instruct", draft=None, quantize="int4", progress=False)
    assert eng.precision == "int4"
    r = eng.generate(
        "Count from one to twenty in words.",
        DecodeConfig.create(
            "exact", drafter="ngram", num_draft_tokens=8, max_new_tokens=48, adaptive_draft_length=False
        ),
    )
    assert len(r.token_ids) > 0 and r.stats.precision == "int4" and r.stats.target_forwards <= r.stats.rounds + 1
