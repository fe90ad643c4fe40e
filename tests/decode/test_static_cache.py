"""The static cache and compiled forwards (issue 22, 5): same tokens as the dynamic cache, rollback by
length, padding to fixed shapes, and clear refusals where it cannot serve."""

from __future__ import annotations

import pytest
import torch

from loosespec.config import DecodeConfig
from loosespec.decode.engine import Engine
from loosespec.decode.kv import CachedLM, StaticCachedLM
from loosespec.errors import LoosespecError
from tests.conftest import make_tiny_model

CONFIGS = [
    ("ar", None, 0.0),
    ("exact", "ngram", 0.0),
    ("exact", "model", 0.0),
    ("exact", "mla", 0.0),
    ("fly", "mla", 0.0),
    ("rejection", "mla", 0.7),
    ("fly", "model", 0.7),
]


def _static_engine(engine: Engine, compile_backend: str | None) -> Engine:
    """The tiny pair's models behind static caches (the same modules: nothing is copied)."""
    return Engine(
        engine.target,
        engine.draft,
        cache_implementation="static",
        max_cache_len=512,
        compile=compile_backend is not None,
        compile_backend=compile_backend or "inductor",
    )


@pytest.mark.parametrize(
    "compile_backend", [None, pytest.param("eager", marks=pytest.mark.slow)], ids=["static", "static-compiled"]
)  # compiling is off by default: make test-full
def test_static_cache_generates_what_the_dynamic_cache_does(tiny_engine, compile_backend):
    static = _static_engine(tiny_engine, compile_backend)
    prompt = "def fib(n):\n    return fib(n - 1) + fib(n - 2)\n\ndef fib"
    for method, drafter, temperature in CONFIGS:
        cfg = DecodeConfig.create(
            method, drafter, max_new_tokens=48, temperature=temperature, seed=3, adaptive_draft_length=False
        )
        want = tiny_engine.generate(prompt, cfg)
        got = static.generate(prompt, cfg)
        assert got.token_ids == want.token_ids, (method, drafter, temperature)
        assert got.stats.accepted_tokens == want.stats.accepted_tokens
    if compile_backend is not None:  # the draft steps and the verifies ran the fixed-shape graph
        assert static.target_lm.compiled_forwards > 0 and static.draft_lm.compiled_forwards > 0
    assert got.config["cache_implementation"] == "static" and got.config["compile"] is (compile_backend is not None)


def test_rollback_sets_the_length_and_stale_positions_are_never_attended(tiny_engine):
    model = tiny_engine.target.model
    g = torch.Generator().manual_seed(0)
    a = torch.randint(3, 250, (40,), generator=g)
    b = torch.cat([a[:25], torch.randint(3, 250, (9,), generator=g)])  # diverges at 25, shorter than a
    static, dynamic = StaticCachedLM(model, 64), CachedLM(model)
    static.logits(a, rows=1)
    got = static.logits(b, rows=9)  # rolls back from 40 to 25, overwrites positions 25..33
    want = dynamic.logits(b, rows=9)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert int(static.cache.layers[0].cumulative_length) == b.shape[0]


def test_compiled_forwards_are_padded_to_a_bucket_and_the_padding_is_dropped(tiny_engine):
    model = tiny_engine.target.model
    lm = StaticCachedLM(model, 64, compile=True, compile_backend="eager")
    seq = torch.randint(3, 250, (30,), generator=torch.Generator().manual_seed(1))
    lm.logits(seq[:20], rows=1)  # the prefill: eager
    assert lm.compiled_forwards == 0
    got = lm.logits(seq[:25], rows=5)  # 5 new tokens: padded to 8
    assert lm.compiled_forwards == 1 and got.shape[0] == 5
    assert int(lm.cache.layers[0].cumulative_length) == 25  # not 28: the padding is not part of the sequence
    torch.testing.assert_close(got, CachedLM(model).logits(seq[:25], rows=5), rtol=1e-4, atol=1e-4)


def test_static_cache_refusals(tiny_engine, tiny_dir):
    model = tiny_engine.target.model
    lm = StaticCachedLM(model, 16)
    with pytest.raises(LoosespecError, match="static cache's 16 positions"):
        lm.logits(torch.arange(3, 23), rows=1)
    lm.logits(torch.arange(3, 13), rows=1)  # the cache still serves after the refusal
    with pytest.raises(LoosespecError, match="compile needs cache_implementation 'static'"):
        Engine(tiny_engine.target, tiny_engine.draft, compile=True)
    with pytest.raises(LoosespecError, match="'dynamic' or 'static'"):
        Engine(tiny_engine.target, tiny_engine.draft, cache_implementation="offloaded")
    static = Engine(tiny_engine.target, tiny_engine.draft, cache_implementation="static", max_cache_len=256)
    with pytest.raises(LoosespecError, match="specguard' needs cache_implementation 'dynamic'"):
        static.generate("x", DecodeConfig.create("specguard", max_new_tokens=4))


def test_a_sliding_window_model_is_refused_with_the_reason():
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=8,
        max_position_embeddings=128,
    )
    with pytest.raises(LoosespecError, match="StaticSlidingWindowLayer"):
        StaticCachedLM(MistralForCausalLM(cfg).eval(), 64)
    StaticCachedLM(make_tiny_model(0), 64)  # full attention: accepted
