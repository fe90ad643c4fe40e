"""int8 with per-token activation scales: a token's result does not depend on the rest of the forward."""

import pytest
import torch

from loosespec import quant
from loosespec.decode.kv import CachedLM
from loosespec.quant import RowwiseInt8Linear, quantize_model

pytestmark = pytest.mark.skipif(quant.int8_supported() is False, reason="torch has no x86/fbgemm int8 engine")


def batch_with_outlier(n: int = 16, width: int = 96) -> torch.Tensor:
    x = torch.randn(n, width, generator=torch.Generator().manual_seed(0))
    x[3] *= 50  # one row with a large range: a per-tensor scale would coarsen every other row
    return x


def test_row_alone_equals_row_in_batch_bit_for_bit():
    lin = torch.nn.Linear(96, 200)
    q = RowwiseInt8Linear.from_linear(lin)
    x = batch_with_outlier()
    full = q(x)
    alone = torch.cat([q(x[i : i + 1]) for i in range(x.shape[0])])
    assert torch.equal(full, alone)
    assert torch.equal(q(x[None])[0], full)  # [B, T, C] inputs too
    rel = (full - lin(x)).abs().max() / lin(x).abs().max()
    assert rel < 0.03  # an 8-bit approximation of the float layer


def test_per_tensor_dynamic_quantization_is_not_batch_invariant():
    """Negative control: torch's own dynamic int8 (one scale per batch) fails the check above."""
    lin = torch.nn.Linear(96, 200)
    dyn = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8)
    x = batch_with_outlier()
    with torch.no_grad():
        full = dyn(x)
        alone = torch.cat([dyn(x[i : i + 1]) for i in range(x.shape[0])])
    assert not torch.equal(full, alone)


def test_quantized_tiny_model_gives_same_logits_for_1_and_16_token_forwards(tiny_dir):
    from transformers import AutoModelForCausalLM

    model = quantize_model(AutoModelForCausalLM.from_pretrained(tiny_dir / "target", dtype=torch.float32).eval())
    assert any(isinstance(m, RowwiseInt8Linear) for m in model.modules())
    lm = CachedLM(model)
    seq = torch.randint(3, 259, (70,), generator=torch.Generator().manual_seed(1))
    lm.logits(seq[:50], rows=1)  # cached context
    block = lm.logits(seq[:66], rows=16)
    single = torch.stack([lm.logits(seq[: 51 + i], rows=1)[0] for i in range(16)])
    assert torch.equal(block, single)
    assert torch.equal(block.argmax(-1), single.argmax(-1))


def test_quantized_weights_are_cached(tiny_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    def fresh():
        return AutoModelForCausalLM.from_pretrained(tiny_dir / "target", dtype=torch.float32).eval()

    cache = tmp_path / "int8" / "tiny.safetensors"
    first = quantize_model(fresh(), cache)
    assert cache.exists()

    def no_quantizing(weight):
        raise AssertionError("the cache should have been read")

    monkeypatch.setattr(quant, "quantize_weight", no_quantizing)
    second = quantize_model(fresh(), cache)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():
        assert torch.equal(first(ids).logits, second(ids).logits)


def test_torn_cache_is_rebuilt(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    cache = tmp_path / "torn.safetensors"
    cache.write_bytes(b"not a safetensors file")
    quantize_model(AutoModelForCausalLM.from_pretrained(tiny_dir / "target", dtype=torch.float32).eval(), cache)
    from safetensors.torch import load_file

    assert any(k.endswith(".qweight") for k in load_file(str(cache)))


@pytest.mark.real_model
@pytest.mark.parametrize("drafter", ["ngram", pytest.param("model", marks=pytest.mark.slow)])
def test_smollm_int8_exact_equals_ar(drafter, tmp_path, monkeypatch):
    """End to end on a real model in int8: lossless stays lossless within the precision."""
    from loosespec.config import DecodeConfig
    from loosespec.decode.engine import Engine
    from loosespec.models import load

    t = load("smollm2-135m-instruct", "auto", "cpu", progress=False, quantize="int8")
    d = load("smollm2-135m-instruct", "auto", "cpu", progress=False, quantize="int8") if drafter == "model" else None
    assert t.precision.name == "int8"
    engine = Engine(t, d)
    prompt = "Write a Python function that checks whether a string is a palindrome."
    ar = engine.generate(prompt, DecodeConfig.create("ar", max_new_tokens=48))
    for adaptive in (False, True):
        cfg = DecodeConfig.create(
            "exact",
            drafter,
            num_draft_tokens=8,
            max_new_tokens=48,
            has_draft_model=d is not None,
            adaptive_draft_length=adaptive,
        )
        r = engine.generate(prompt, cfg)
        assert r.token_ids == ar.token_ids, adaptive
    assert r.stats.precision == "int8"


def test_plain_causal_recognises_only_the_causal_mask():
    from loosespec.quant import plain_causal

    n, total = 3, 7
    causal = torch.arange(total)[None, :] <= (total - n + torch.arange(n))[:, None]
    assert plain_causal(None, n, total)
    assert plain_causal(causal[None, None], n, total)
    additive = torch.zeros(1, 1, n, total).masked_fill(~causal, float("-inf"))
    assert plain_causal(additive, n, total)
    padded = causal.clone()
    padded[:, 0] = False  # a padded first position
    assert not plain_causal(padded[None, None], n, total)
    assert not plain_causal(causal[None, None], n + 1, total + 1)  # another shape


def test_quantize_progress_bar_counts_the_linear_layers(tiny_dir, tmp_path, capsys):
    """``progress=True``: a bar on stderr with one step per Linear layer (quantized afresh, then read from the
    cache); off by default."""
    import re

    from transformers import AutoModelForCausalLM

    def fresh():
        return AutoModelForCausalLM.from_pretrained(tiny_dir / "target", dtype=torch.float32).eval()

    n = sum(isinstance(m, torch.nn.Linear) for m in fresh().modules())
    assert n == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the head
    cache = tmp_path / "int8.safetensors"
    for desc in ("quantizing to int8", "int8 (cached)"):
        model = fresh()
        capsys.readouterr()
        quantize_model(model, cache, progress=True)
        err = capsys.readouterr().err
        assert desc in err and f"{n}/{n}" in err, err
        assert {int(total) for total in re.findall(r"\d+/(\d+)", err)} == {n}, err
    model = fresh()
    capsys.readouterr()
    quantize_model(model, cache)
    assert capsys.readouterr().err == ""
