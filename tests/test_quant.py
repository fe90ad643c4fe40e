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


@pytest.mark.parametrize(
    "layer, out_features, tolerance",
    [
        (RowwiseInt8Linear, 200, 0.03),  # an 8-bit approximation of the float layer
        # 16 levels per group of 32 weights and bfloat16 inputs: coarser, but not noise (the correlation below)
        pytest.param(
            quant.W4A16Linear,
            208,  # the packed kernel takes multiples of 16 outputs
            0.15,
            marks=pytest.mark.skipif(not quant.w4a16_supported(), reason="torch has no packed int4 CPU kernel"),
        ),
    ],
)
def test_row_alone_equals_row_in_batch_bit_for_bit(layer, out_features, tolerance):
    lin = torch.nn.Linear(96, out_features)
    q = layer.from_linear(lin)
    x = batch_with_outlier()
    full = q(x)
    alone = torch.cat([q(x[i : i + 1]) for i in range(x.shape[0])])
    assert torch.equal(full, alone)
    assert torch.equal(q(x[None])[0], full)  # [B, T, C] inputs too
    ref = lin(x)
    assert full.dtype == torch.float32
    assert (full - ref).abs().max() / ref.abs().max() < tolerance
    assert torch.corrcoef(torch.stack([full.flatten(), ref.flatten()]))[0, 1] > 0.99


def test_per_tensor_dynamic_quantization_is_not_batch_invariant():
    """Negative control: torch's own dynamic int8 (one scale per batch) fails the check above."""
    lin = torch.nn.Linear(96, 200)
    dyn = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8)
    x = batch_with_outlier()
    with torch.no_grad():
        full = dyn(x)
        alone = torch.cat([dyn(x[i : i + 1]) for i in range(x.shape[0])])
    assert not torch.equal(full, alone)


@pytest.mark.parametrize(
    "quantizer, layer",
    [
        (quantize_model, RowwiseInt8Linear),
        pytest.param(
            quant.quantize_model_w4,
            quant.W4A16Linear,
            marks=pytest.mark.skipif(not quant.w4a16_supported(), reason="torch has no packed int4 CPU kernel"),
        ),
    ],
)
def test_quantized_tiny_model_gives_same_logits_for_1_and_16_token_forwards(tiny_dir, quantizer, layer):
    from transformers import AutoModelForCausalLM

    model = quantizer(AutoModelForCausalLM.from_pretrained(tiny_dir / "target", dtype=torch.float32).eval())
    assert any(isinstance(m, layer) for m in model.modules())
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
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
@pytest.mark.parametrize(
    "quantize",
    ["int8", pytest.param("w4a16", marks=pytest.mark.skipif(not quant.w4a16_supported(), reason="no int4 kernel"))],
)
@pytest.mark.parametrize("drafter", ["ngram", pytest.param("model", marks=pytest.mark.slow)])
def test_smollm_exact_equals_ar_within_the_precision(drafter, quantize):
    """End to end on a real model in int8 and in w4a16: lossless stays lossless within the precision."""
    from loosespec.config import DecodeConfig
    from loosespec.decode.engine import Engine
    from loosespec.models import load

    t = load("smollm2-135m-instruct", "auto", "cpu", progress=False, quantize=quantize)
    d = load("smollm2-135m-instruct", "auto", "cpu", progress=False, quantize=quantize) if drafter == "model" else None
    assert t.precision.name == quantize
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
    assert r.stats.precision == quantize


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


w4 = pytest.mark.skipif(not quant.w4a16_supported(), reason="torch has no packed int4 CPU kernel")


@w4
def test_w4_weights_on_16_levels_per_group_come_back_exactly():
    """A group already on 16 evenly spaced levels spanning its range (a Q4_K sub-block) is represented exactly,
    up to bfloat16's rounding of scale and zero: the kernel's product equals the dequantized weights' matmul."""
    from loosespec.quant import W4_GROUP, W4A16Linear, quantize_weight_w4

    gen = torch.Generator().manual_seed(3)
    out_f, in_f = 64, 4 * W4_GROUP
    levels = torch.randint(0, 16, (out_f, in_f), generator=gen)
    levels[:, ::W4_GROUP] = 0  # every group spans 0..15
    levels[:, 1::W4_GROUP] = 15
    scale = torch.tensor(2.0) ** torch.randint(-8, -3, (out_f, in_f // W4_GROUP, 1), generator=gen)  # bf16-exact
    lo = -8 * scale
    w = (levels.reshape(out_f, -1, W4_GROUP) * scale + lo).reshape(out_f, in_f)
    q, sz = quantize_weight_w4(w)
    assert torch.equal(q, levels.to(torch.int32))
    x = torch.randn(5, in_f, generator=gen).bfloat16().float()  # inputs bfloat16 holds exactly
    got = W4A16Linear(q, sz, None)(x)
    assert torch.allclose(got, x @ w.T, rtol=2e-2, atol=1e-3)


@w4
def test_w4a16_sends_a_layer_it_cannot_pack_to_int8():
    from loosespec.quant import W4A16Linear, quantize_model_w4

    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 20), torch.nn.Linear(20, 16))
    model.set_attn_implementation = lambda name: None  # not a transformers model: no attention to switch
    quantize_model_w4(model)
    # 20 outputs (not a multiple of 16), then 20 inputs (not a multiple of the group of 32)
    assert [type(m) for m in model] == [W4A16Linear, RowwiseInt8Linear, RowwiseInt8Linear]
    x = torch.randn(3, 64)
    assert torch.equal(model(x), torch.cat([model(x[i : i + 1]) for i in range(3)]))


@w4
@pytest.mark.real_model
def test_w4a16_reads_fewer_bytes_than_int8():
    """4 bits plus a bfloat16 scale and zero per 32 weights: about 0.63 of int8's bytes per token."""
    from loosespec.cost import weight_bytes
    from loosespec.models import load

    w4, i8 = (load("smollm2-135m-instruct", "auto", "cpu", progress=False, quantize=q).model for q in ("w4a16", "int8"))
    assert weight_bytes(w4) < 0.75 * weight_bytes(i8)


def test_layers_packed_in_parallel_are_the_layers_packed_one_by_one(tiny_dir):
    """quantize_model packs the layers on several threads: each layer is the one its own weights make alone (same
    outputs bit for bit), none swapped with another of the same shape."""
    from transformers import AutoModelForCausalLM

    float_model = AutoModelForCausalLM.from_pretrained(tiny_dir / "target", dtype=torch.float32).eval()
    alone = {n: RowwiseInt8Linear.from_linear(m) for n, m in float_model.named_modules() if type(m) is torch.nn.Linear}
    threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, 2))  # at least two packing threads, whatever the machine
    try:
        model = quantize_model(float_model)
    finally:
        torch.set_num_threads(threads)
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(0))
    for name, layer in alone.items():
        packed = model.get_submodule(name)
        with torch.inference_mode():
            assert torch.equal(packed(x[:, : packed.in_features]), layer(x[:, : layer.in_features])), name
