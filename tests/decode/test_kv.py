"""KV-cache rollback (loosespec.decode.kv) for every kind of cache layer: full attention, sliding-window attention
past its window, and the layers it cannot roll back (refused up front with a clear error)."""

import pytest
import torch
from conftest import TINY_VOCAB, make_tiny_tokenizer, perturbed_copy

from loosespec import DecodeConfig
from loosespec.decode.kv import CachedLM
from loosespec.errors import LoosespecError
from loosespec.models import LoadedModel, ModelSource

WINDOW = 8


def tiny_gemma3(seed: int = 1):
    """A random Gemma 3 (two sliding-window layers of WINDOW positions, one full), float32: Gemma 3's cache layout."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        max_position_embeddings=1024,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    model = Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)  # well separated greedy choices (conftest.make_tiny_model), drafts rejected
    return model


def window_layers(lm):
    return [layer for layer in lm.cache.layers if type(layer).__name__ == "DynamicSlidingWindowLayer"]


@pytest.fixture(scope="module")
def gemma():
    return tiny_gemma3()


def fresh(model, seq, rows):
    with torch.no_grad():
        return model(seq.unsqueeze(0)).logits[0, -rows:].float()


def test_sliding_window_rolls_back_past_its_window(gemma):
    """transformers' own crop raises here (the window is full and the layer does not record its past)."""
    lm = CachedLM(gemma)
    assert len(window_layers(lm)) == 2
    seq = torch.arange(3, 43)  # 40 positions, 5 windows
    lm.logits(seq, rows=1)
    for cut in (36, 30, 25):  # rejected drafts of 4, then 10 and 10 positions, each past the window
        other = torch.cat([seq[:cut], torch.arange(100, 105)])
        assert torch.allclose(lm.logits(other, rows=5), fresh(gemma, other, 5), atol=1e-5)
        assert lm.cache.get_seq_length() == other.shape[0]
        seq = other
    assert lm.recomputes == 0


def test_sliding_window_stays_bounded(gemma):
    """One token at a time, as ar decodes: the window layers keep window - 1 + margin positions (+ the fed ones)."""
    lm = CachedLM(gemma)
    lm.margin = 4
    seq = torch.arange(3, 13)
    lm.logits(seq, rows=1)
    for t in range(40):
        seq = torch.cat([seq, torch.tensor([50 + t])])
        lm.logits(seq, rows=1)
        assert all(layer.keys.shape[-2] <= WINDOW - 1 + lm.margin + 1 for layer in window_layers(lm))
    assert lm.cache.layers[-1].keys.shape[-2] == seq.shape[0]  # the full-attention layer keeps everything
    assert torch.allclose(lm.logits(seq, rows=1), fresh(gemma, seq, 1), atol=1e-5)


def test_rollback_deeper_than_the_margin_recomputes(gemma):
    lm = CachedLM(gemma)
    lm.margin = 2
    seq = torch.arange(3, 43)
    lm.logits(seq, rows=1)
    lm.logits(seq, rows=1)  # trims the window layers to window - 1 + 2
    other = torch.cat([seq[:20], torch.arange(100, 105)])  # 20 positions back: more than the layers hold
    assert torch.allclose(lm.logits(other, rows=5), fresh(gemma, other, 5), atol=1e-5)
    assert lm.recomputes == 1 and lm.cache.get_seq_length() == other.shape[0]


@pytest.fixture(scope="module")
def gemma_engine(gemma):
    from loosespec.decode.engine import Engine

    tok = make_tiny_tokenizer()

    def loaded(model, name):
        return LoadedModel(ModelSource(name, "local", name, "local"), model, tok)

    return Engine(loaded(gemma, "tiny-gemma3"), loaded(perturbed_copy(gemma, 0.1, seed=1), "tiny-gemma3-draft"))


PROMPT = (
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"  # 64 tokens: 8 windows
)


@pytest.mark.parametrize("drafter", ["ngram", "model", "mla"])
def test_exact_equals_ar_on_a_sliding_window_model(gemma_engine, drafter):
    def run(method, drafter=None):
        cfg = DecodeConfig.create(method, drafter, has_draft_model=True, max_new_tokens=40, adaptive_draft_length=False)
        return gemma_engine.generate(PROMPT, cfg, raw=True)

    ar = run("ar")
    r = run("exact", drafter)
    assert r.stats.prompt_tokens > 4 * WINDOW
    assert r.token_ids == ar.token_ids
    assert r.stats.drafted_tokens > r.stats.accepted_tokens  # rejected drafts: rollbacks past the window
    assert gemma_engine.target_lm.recomputes == 0


def tiny_lfm2():
    """A random LFM2: convolution layers (a running state, no per-position keys and values) and full attention."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    torch.manual_seed(0)
    cfg = Lfm2Config(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        full_attn_idxs=[1],
        max_position_embeddings=1024,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    return Lfm2ForCausalLM(cfg).eval()


def test_a_cache_that_cannot_roll_back_is_refused_up_front():
    from loosespec.decode.engine import Engine

    model = tiny_lfm2()
    assert "LinearAttentionLayer" in CachedLM(model).rollback_problem
    assert CachedLM(tiny_gemma3()).rollback_problem is None
    e = Engine(LoadedModel(ModelSource("tiny-lfm2", "local", "tiny-lfm2", "local"), model, make_tiny_tokenizer()))
    for method, temperature in (("exact", 0.0), ("rejection", 1.0)):
        with pytest.raises(LoosespecError, match="cannot run on 'tiny-lfm2'.*LinearAttentionLayer.*method 'ar' can"):
            e.generate(
                PROMPT, DecodeConfig.create(method, "ngram", temperature=temperature, max_new_tokens=8), raw=True
            )
    assert len(e.generate(PROMPT, DecodeConfig.create("ar", max_new_tokens=8), raw=True).token_ids) == 8
    # the rollback site itself refuses too, with the same reason, rather than corrupting the state
    lm = CachedLM(model)
    lm.logits(torch.arange(3, 20), rows=1)
    with pytest.raises(LoosespecError, match="cannot roll back"):
        lm.logits(torch.arange(3, 15), rows=1)


def ready(name: str) -> bool:
    from loosespec.models import list_models

    return any(m.name == name and m.state == "ready" for m in list_models())


def long_prompt(lines: int = 60) -> str:
    """Numbered instructions (about 17 Gemma tokens a line): what repeats gives the n-gram lookup matches, the
    numbers and letters that change make it miss."""
    shelves = "ABCDE"
    return "".join(
        f"Step {i}: move box {i % 7} from shelf {shelves[i % 5]} to shelf {shelves[(3 * i + 1) % 5]}.\n"
        for i in range(1, lines + 1)
    )


@pytest.mark.real_model
@pytest.mark.slow  # make test rolls back past a window on a random Gemma 3 (test_exact_equals_ar_on_a_sliding_window_model)
@pytest.mark.skipif(
    not ready("gemma-3-270m"), reason="gemma-3-270m not prepared: loosespec models pull gemma-3-270m (make test does)"
)
def test_gemma3_rolls_back_past_its_sliding_window():
    """The embedded Gemma 3 270M (sliding window of 512 on 15 of its 18 layers) on a prompt of about 1,000 tokens:
    before the fix the first rejected draft ended in transformers' RuntimeError ("crop was called, but the current
    layer does not track past states")."""
    from loosespec.decode.engine import Engine
    from loosespec.decode.kv import ROLLBACK_MARGIN

    e = Engine.load("gemma-3-270m", None, dtype="float32", device="cpu", progress=False)
    window = e.target.model.config.sliding_window
    prompt = long_prompt()

    def run(method, drafter=None):
        cfg = DecodeConfig.create(method, drafter, max_new_tokens=32, adaptive_draft_length=False)
        return e.generate(prompt, cfg, raw=True)

    ar = run("ar")
    r = run("exact", "ngram")
    assert r.stats.prompt_tokens > window + ROLLBACK_MARGIN  # the window layers are trimmed, then rolled back
    assert r.token_ids == ar.token_ids
    assert r.stats.accepted_tokens > 0 and r.stats.drafted_tokens > r.stats.accepted_tokens  # rollbacks
    assert e.target_lm.recomputes == 0
