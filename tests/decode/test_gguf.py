"""The llama.cpp forward (--quantize int4): its cache bookkeeping against a fake llama.cpp context and the draft's
precision rule (always run); on a real GGUF where llama-cpp-python is installed (``make peers``), ``exact`` equal to
``ar`` token for token with the draft in int4 and with the target in int4 (batch-invariant as loosespec runs
llama.cpp)."""

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
        self.asked: list[int] = []  # how many of them asked for logits
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
        self.asked.append(sum(bool(b.logits[j]) for j in range(b.n_tokens)))

    def get_logits_ith(self, i):
        return self.out[i]


class FakeLM(GgufLM):
    def _open(self, model, n_ctx, repack):
        n = gguf.N_BATCH
        batch = SimpleNamespace(
            n_tokens=0, token=[0] * n, pos=[0] * n, seq_id=[[0] for _ in range(n)], n_seq_id=[0] * n, logits=[False] * n
        )
        ctx = FakeContext()
        ctx.repack = repack
        return ctx, SimpleNamespace(batch=batch), V, n_ctx


def fake_copy(src, dst):
    assert dst.cache == [], "the decoding context's cache is cleared before a prefill is copied in"
    dst.cache = list(src.cache)


@pytest.fixture
def lm(monkeypatch):
    """One context, as with prefill_repack=None: the prefill runs where the rows do."""
    monkeypatch.setattr(gguf, "N_BATCH", 8)
    return FakeLM(
        GgufModel("none.gguf", SimpleNamespace(vocab_size=V)), threads=1, n_ctx=64, row_chunk=4, prefill_repack=None
    )


def rows_of(seq: list[int], rows: int) -> torch.Tensor:
    return torch.tensor([reference(seq[: len(seq) - rows + i + 1]) for i in range(rows)])


def test_verify_rows_and_rollback(lm):
    """The rows asked for run in forwards of at most row_chunk positions (each row then runs as a one-token forward
    would in llama.cpp); what comes before them in chunks of N_BATCH, asking for nothing."""
    seq = list(range(3, 24))  # 21 ids, the last 6 asked for: 15 catch-up positions as 8 + 7, the rows as 4 + 2
    out = lm.logits(torch.tensor(seq), rows=6)
    assert torch.equal(out, rows_of(seq, 6))
    assert lm._ctx.fed == [8, 7, 4, 2] and lm._ctx.asked == [0, 0, 4, 2] and lm._ctx.cache == seq
    # a rejected draft: the next sequence shares 19 ids; only the rest is fed, after a rollback
    nxt = seq[:19] + [40, 41, 42]
    assert torch.equal(lm.logits(torch.tensor(nxt), rows=3), rows_of(nxt, 3))
    assert lm._ctx.fed[-1] == 3 and lm._ctx.cache == nxt
    # the same sequence again with more rows: the cache keeps what it can and recomputes the rows asked for
    assert torch.equal(lm.logits(torch.tensor(nxt), rows=5), rows_of(nxt, 5))
    assert lm._ctx.fed[-2:] == [4, 1] and lm.forwards == 3


def test_prefill_and_refusals(lm):
    seq = torch.arange(20, 40)
    lm.prefill(seq)
    lm.prefill(seq)  # held already: no forward
    assert lm.forwards == 1 and lm._ctx.cache == seq.tolist()
    assert lm._ctx.fed == [8, 8, 4] and lm._ctx.asked == [0, 0, 0]  # a prefill: N_BATCH chunks, no logits
    # the row after a prefill runs alone, as ar's and every verify's first row do
    assert torch.equal(lm.logits(torch.arange(20, 41), rows=1), rows_of(list(range(20, 41)), 1))
    assert lm._ctx.fed[-1] == 1
    with pytest.raises(LoosespecError, match="exceeds the llama.cpp context"):
        lm.logits(torch.arange(65), rows=1)
    with pytest.raises(LoosespecError, match="rows must be"):
        lm.logits(torch.arange(12), rows=13)
    with pytest.raises(LoosespecError, match="cache_type"):
        FakeLM(GgufModel("none.gguf", SimpleNamespace(vocab_size=V)), threads=1, n_ctx=64, cache_type="int3")
    lm.reset()
    assert lm._ctx.cache == [] and lm.ids.numel() == 0


def test_a_prefill_runs_in_its_own_context_and_is_copied_into_the_decoding_one(monkeypatch):
    """With the default settings (repacked weights for the rows, the GGUF's own layout for a prefill), a forward from
    an empty cache feeds everything before the rows to a second context, opened once, in N_BATCH chunks without
    logits; its cache is copied into the decoding context, where the rows run in pieces of ROW_CHUNK. A forward that
    continues the cache never touches the prefill context."""
    monkeypatch.setattr(gguf, "N_BATCH", 8)
    monkeypatch.setattr(gguf, "copy_sequence", fake_copy)
    lm = FakeLM(GgufModel("none.gguf", SimpleNamespace(vocab_size=V)), threads=1, n_ctx=64)
    assert (lm.repack, lm.prefill_repack, lm.row_chunk) == (True, False, 3) and lm._prefill_ctx is None
    seq = list(range(3, 23))  # 20 ids, the last 5 asked for: 15 prefill positions as 8 + 7, the rows as 3 + 2
    assert torch.equal(lm.logits(torch.tensor(seq), rows=5), rows_of(seq, 5))
    pre = lm._prefill_ctx
    assert pre.repack is False and lm._ctx.repack is True
    assert pre.fed == [8, 7] and pre.asked == [0, 0] and pre.cache == []  # emptied after the copy
    assert lm._ctx.fed == [3, 2] and lm._ctx.asked == [3, 2] and lm._ctx.cache == seq
    assert lm.forwards == 1 and lm.settings["prefill_repack"] is False
    nxt = seq + [50, 51]  # a verify continuing the cache: the decoding context alone
    assert torch.equal(lm.logits(torch.tensor(nxt), rows=3), rows_of(nxt, 3))
    assert pre.fed == [8, 7] and lm._ctx.fed[-1] == 3 and lm._ctx.cache == nxt
    lm.reset()  # the next prompt prefills in the same prefill context again
    lm.prefill(torch.tensor(seq[:9]))
    assert lm._prefill_ctx is pre and pre.fed == [8, 7, 8, 1] and lm._ctx.cache == seq[:9]
    with pytest.raises(LoosespecError, match="row_chunk"):
        FakeLM(GgufModel("none.gguf", SimpleNamespace(vocab_size=V)), threads=1, n_ctx=64, row_chunk=0)


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


def test_a_model_that_transformers_runs_is_never_put_in_llamacpp_by_auto():
    from loosespec.decode.engine import draft_role, target_role
    from loosespec.hardware import resolve_precision

    kw = dict(engine="x86", gguf=True, llamacpp=True)
    for role in (draft_role, target_role):
        assert resolve_precision("auto", "auto", "cpu", role=role(False), **kw).name == "int4"
        assert resolve_precision("auto", "auto", "cpu", role=role(True), **kw).name != "int4"


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
def test_an_int4_target_is_batch_invariant_past_512_cached_positions():
    """The settings loosespec runs llama.cpp with (repacked weights, logits only in forwards of at most ROW_CHUNK
    positions, flash attention on a bfloat16 cache, the prompt prefilled in a second context and copied in): a
    16-row verify equals 16 one-token forwards bit for bit, past the 512 cached positions where flash attention on an
    f16 cache splits a single query's keys (which this test catches: with cache_type="f16" no row is equal). The
    repacked gemm's groups of 4 rows are caught on the Qwen GGUFs (Q4_K, benchmarks/forward_cost.py), not here: this
    model's matrices are Q4_1, which took no 4-row gemm (row_chunk=4 left all 16 rows equal, measured)."""
    from loosespec.models import load

    loaded = load("smollm2-135m-instruct", quantize="int4", progress=False)
    lm = GgufLM(loaded.model)
    seq = torch.randint(
        100, int(loaded.model.config.vocab_size), (600 + 16,), generator=torch.Generator().manual_seed(0)
    )
    lm.prefill(seq[:600])
    batched = lm.logits(seq, rows=16).clone()
    single = torch.stack([lm.logits(seq[: 600 + i + 1], rows=1)[0].clone() for i in range(16)])
    assert torch.equal(batched, single)


@needs_llama
def test_an_int4_target_keeps_exact_equal_to_ar():
    """--quantize int4 for the target: llama.cpp's forward, batch-invariant as run here, so exact equals ar token for
    token while verifying drafts of 8 (two forwards of at most ROW_CHUNK positions each)."""
    from loosespec import DecodeConfig, Engine

    eng = Engine.load("smollm2-135m-instruct", draft=None, quantize="int4", progress=False)
    assert eng.precision == "int4"
    prompt = "Count from one to twenty in words, then count back down to one."
    ar = eng.generate(prompt, DecodeConfig.create("ar", max_new_tokens=64))
    ex = eng.generate(
        prompt,
        DecodeConfig.create(
            "exact", drafter="ngram", num_draft_tokens=8, max_new_tokens=64, adaptive_draft_length=False
        ),
    )
    assert ex.token_ids == ar.token_ids
    assert ex.stats.drafted_tokens > 0 and ex.stats.precision == "int4"
    assert ex.stats.target_forwards < ar.stats.target_forwards  # drafts were accepted, in fewer forwards


@needs_llama
def test_int4_results_record_llamacpps_settings(tmp_path):
    """What ran: a generation's config names the llama.cpp settings of each model it ran there, and a bench directory
    with an int4 model records them, so a later run under other settings is refused instead of mixing rows."""
    import json

    from typer.testing import CliRunner

    from loosespec import DecodeConfig, Engine
    from loosespec.cli import app

    eng = Engine.load("smollm2-135m-instruct", draft=None, quantize="int4", progress=False)
    cfg = eng.generate("Hi", DecodeConfig.create("ar", max_new_tokens=2)).config
    assert cfg["precision"]["forward"] == gguf.settings() == eng.target_lm.settings
    out = tmp_path / "b"
    args = ["bench", "--target", "smollm2-135m-instruct", "--draft", "none", "--quantize", "int4", "--dataset"]
    args += ["gsm8k", "--limit", "1", "--max-new-tokens", "4", "--methods", "ar", "--no-plots", "--out", str(out)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    stored = json.loads((out / "config.json").read_text())
    assert stored["llamacpp_forward"] == gguf.settings()
    stored["llamacpp_forward"]["row_chunk"] = 7  # as if written under the setting before
    (out / "config.json").write_text(json.dumps(stored))
    r = CliRunner().invoke(app, args)
    said = str(r.exception)
    assert r.exit_code != 0 and "different configuration" in said and "llamacpp_forward" in said
