"""Quantized Linear layers whose result for a token does not depend on the other tokens in the forward: int8
(below) and w4a16 (:class:`W4A16Linear`: 4-bit weights per group of 32, bfloat16 activations, torch's packed int4
CPU kernel, which computes each output row from its own input row, so about 0.63 of int8's bytes per weight come
with the same batch invariance).

Why: on CPUs without bfloat16 arithmetic a verify forward over 16 tokens cost 8.5x a 1-token
forward in bfloat16 (``results/rule_cost.txt``); with torch's fbgemm int8 kernels 2.15x
(``results/bench/cpu/cost_target.json``), which is what makes speculation pay there. But fbgemm's dynamic quantization takes ONE
activation scale for the whole batch: a token verified inside a 16-token forward is quantized
differently from the same token decoded alone, and lossless methods stop equalling ``ar``.

How: each activation row is scaled to absmax 1 and two constant columns holding -1 and +1 are
appended (their weight columns are zero). Every batch then spans exactly [-1, 1], so fbgemm's
per-tensor quantization parameters are the same for every forward, each row is quantized the
same way alone or in a batch, and the int8 x int8 products are summed in exact integer
arithmetic. The output row is multiplied back by its scale and the bias added. Result: per-token
(row-wise) activation quantization, bit-identical for a row alone and inside any batch
(``tests/test_quant.py``), at fbgemm's speed. Weights are symmetric int8 per output channel.

Quantization changes the model (a different, 8-bit model, not the dequantized GGUF in float32):
its task accuracy is measured next to float32's in BENCHMARKS.md. Lossless methods stay lossless
*within* this precision: ``exact`` equals ``ar`` in int8 token for token.

The Linear layers are not the only place where a row can depend on its batch: attention over 16
queries runs other kernel blocks than over one, and in int8 a last-bit difference can move an
activation across a rounding step. :func:`use_rowwise_attention` computes each query of a short
forward (verification, drafting: at most ``ROWWISE_MAX_QUERIES`` queries) with the very call a
1-token forward makes: one query against the keys up to its own position. Longer forwards
(prefill) use transformers' SDPA; the decode loop prefills the prompt in its own forward for every
method, so that forward is the same for all of them.

Quantized weights are cached (``$LOOSESPEC_CACHE/int8/<key>.safetensors``) so a second load skips
the quantization.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

import torch
from torch import nn

PAD = 2  # constant activation columns (-1, +1) that pin fbgemm's per-tensor range to [-1, 1]
FORMAT = "loosespec-int8-rowwise-v1"


def _quiet():
    """torch deprecates the quantized tensor type (not the fbgemm kernels); say it once, not per layer."""
    warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")


def int8_supported() -> bool:
    """Whether this torch build has the x86/fbgemm int8 kernels the layers below run on."""
    return any(e in torch.backends.quantized.supported_engines for e in ("x86", "fbgemm"))


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output channel: ``(int8 [out, in], scale [out] float32)``."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


class RowwiseInt8Linear(nn.Module):
    """A Linear layer in int8: weights per output channel, activations per token (row). CPU only."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        _quiet()
        self.out_features, self.in_features = qweight.shape
        padded = torch.cat([qweight, torch.zeros(self.out_features, PAD, dtype=torch.int8)], dim=1)
        qt = torch._make_per_channel_quantized_tensor(
            padded, scale.double(), torch.zeros(self.out_features, dtype=torch.long), 0
        )
        self._packed = torch.ops.quantized.linear_prepack(qt, None)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone(), persistent=False)
        self.register_buffer("_pad", torch.tensor([-1.0, 1.0]), persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "RowwiseInt8Linear":
        q, scale = quantize_weight(linear.weight)
        return cls(q, scale, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()
        s = x2.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30)
        xn = torch.cat([x2 / s, self._pad.expand(x2.shape[0], PAD)], dim=1)
        y = torch.ops.quantized.linear_dynamic(xn, self._packed, True) * s
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 rowwise"


W4_GROUP = 32  # weights per (scale, zero) pair along the input dimension: Q4_K's own sub-block width


def w4a16_supported() -> bool:
    """Whether this torch build has the packed int4 CPU kernels :class:`W4A16Linear` runs on."""
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"
    )


def w4_fits(linear: nn.Linear, group: int = W4_GROUP) -> bool:
    """Whether a Linear layer's shape goes into the packed int4 kernel: input width a multiple of the group, output
    width a multiple of 16 (the kernel's packing refuses other shapes)."""
    return linear.in_features % group == 0 and linear.in_features >= group and linear.out_features % 16 == 0


def quantize_weight_w4(weight: torch.Tensor, group: int = W4_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit weights per group of ``group`` inputs, rounded to nearest: ``(q, scales_and_zeros)``,
    ``q`` int32 ``[out, in]`` in 0..15 and ``scales_and_zeros`` bfloat16 ``[in / group, out, 2]`` in torch's
    packed-int4 convention, ``w = (q - 8) * scale + zero``. A group whose weights are already 16 evenly spaced
    levels spanning their range (a GGUF Q4_K sub-block of 32) comes back exactly, up to bfloat16's rounding of
    its scale and zero."""
    w = weight.detach().float()
    out_f, in_f = w.shape
    wg = w.reshape(out_f, in_f // group, group)
    lo, hi = wg.amin(dim=-1), wg.amax(dim=-1)
    scale = ((hi - lo) / 15.0).clamp_min(1e-12)
    q = torch.round((wg - lo[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.int32).reshape(out_f, in_f)
    zero = lo + 8.0 * scale
    sz = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
    return q, sz


class W4A16Linear(nn.Module):
    """A Linear layer with 4-bit weights (per group of :data:`W4_GROUP` inputs, a bfloat16 scale and zero each) and
    bfloat16 activations, run by torch's packed int4 CPU kernel (``_weight_int4pack_mm_for_cpu``, the kernel behind
    torchao's and transformers' ``int4_weight_only`` on a CPU). CPU only.

    About 0.63 of int8's bytes per weight (4 bits, plus a bfloat16 scale and zero per 32 weights), which is what a
    memory-bound decode step pays for. Each output row is computed
    from its own input row only, so a row comes out bit-identical alone and inside a batch: verified in
    ``tests/test_quant.py`` and, for the whole model, by ``benchmarks/forward_cost.py``'s 16-row check, which is
    what lets ``exact`` equal ``ar`` in this precision. The input is cast to bfloat16 and the output back to the
    model's float32."""

    def __init__(self, q: torch.Tensor, sz: torch.Tensor, bias: torch.Tensor | None, group: int = W4_GROUP):
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.group = group
        self.register_buffer(
            "packed", torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1), persistent=False
        )
        self.register_buffer("scales_and_zeros", sz.to(torch.bfloat16).contiguous(), persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone(), persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group: int = W4_GROUP) -> "W4A16Linear":
        q, sz = quantize_weight_w4(linear.weight, group)
        return cls(q, sz, linear.bias, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(torch.bfloat16).contiguous()
        y = torch._weight_int4pack_mm_for_cpu(x2, self.packed, self.group, self.scales_and_zeros).float()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, w4a16 group {self.group}"


def quantize_model_w4(model: nn.Module, progress: bool = False, group: int = W4_GROUP) -> nn.Module:
    """Replace every ``nn.Linear`` of a CPU float32 model by :class:`W4A16Linear`, in place, and switch attention
    to :func:`rowwise_attention` (as :func:`quantize_model`). A layer whose input width is not a multiple of
    ``group`` or whose output width is not a multiple of 16 (:func:`w4_fits`) goes to :class:`RowwiseInt8Linear`
    instead (also batch-invariant). ``progress``: a bar on stderr."""
    from tqdm.auto import tqdm

    _quiet()
    for name in tqdm(
        _linear_names(model), desc="quantizing to w4a16", unit="layer", disable=not progress, dynamic_ncols=True
    ):
        linear = model.get_submodule(name)
        module = (
            W4A16Linear.from_linear(linear, group) if w4_fits(linear, group) else RowwiseInt8Linear.from_linear(linear)
        )
        _set_module(model, name, module)
    use_rowwise_attention(model)
    return model


ROWWISE_MAX_QUERIES = 64
ROWWISE_ATTENTION = "loosespec_rowwise"


def plain_causal(attention_mask: torch.Tensor | None, n: int, total: int) -> bool:
    """Whether ``attention_mask`` (bool, or additive with 0 where allowed; ``[..., n, total]``) lets each of
    the last ``n`` of ``total`` positions see exactly itself and the positions before it (None: yes)."""
    if attention_mask is None:
        return True
    allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    pos = torch.arange(total, device=allowed.device)
    causal = pos[None, :] <= (total - n + torch.arange(n, device=allowed.device))[:, None]  # [n, total]
    return allowed.shape[-2:] == causal.shape and bool((allowed == causal).all())


def rowwise_attention(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs
):
    """transformers attention function: each of up to ``ROWWISE_MAX_QUERIES`` queries computed alone.

    query [B, H, n, D], key/value [B, Hkv, L, D] (cache included), the n queries being the last n
    positions. Query i sees keys ``0 .. L - n + i``, exactly what a 1-token forward at its position
    sees, through the same ``scaled_dot_product_attention`` call. Returns ``([B, n, H, D], None)``.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    n = query.shape[2]
    if (
        n > ROWWISE_MAX_QUERIES
        or kwargs.get("sliding_window")
        or kwargs.get("softcap") is not None
        or kwargs.get("position_bias") is not None
        or dropout
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    gqa = query.shape[1] != key.shape[1]
    total = key.shape[2]
    if plain_causal(attention_mask, n, total):  # what the slicing below already does (the usual case)
        attention_mask = None
    rows = []
    for i in range(n):
        kv = total - n + i + 1
        mask = None if attention_mask is None else attention_mask[:, :, i : i + 1, :kv]
        rows.append(
            torch.nn.functional.scaled_dot_product_attention(
                query[:, :, i : i + 1], key[:, :, :kv], value[:, :, :kv], attn_mask=mask, scale=scaling, enable_gqa=gqa
            )
        )
    return torch.cat(rows, dim=2).transpose(1, 2).contiguous(), None


def use_rowwise_attention(model: nn.Module) -> None:
    """Switch a transformers model to :func:`rowwise_attention` (masks built as for SDPA)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ROWWISE_ATTENTION, rowwise_attention)
    AttentionMaskInterface.register(ROWWISE_ATTENTION, sdpa_mask)
    model.set_attn_implementation(ROWWISE_ATTENTION)


def _linear_names(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def cache_file(cache_dir: Path, model_key: str) -> Path:
    return cache_dir / f"{hashlib.sha256(f'{FORMAT}|{model_key}'.encode()).hexdigest()[:20]}.safetensors"


def _in_parallel(make, names: list[str], bar=None):
    """``(name, make(name))`` for every name, made on as many threads as torch computes on: fbgemm's weight packing
    (``linear_prepack``, most of an int8 load) runs one layer per thread and releases the GIL, so two cores pack
    a model in about half the time. The results are the same as made one by one."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, torch.get_num_threads())) as pool:
        for name, made in zip(names, pool.map(make, names)):
            if bar is not None:
                bar.update()
            yield name, made


def quantize_model(model: nn.Module, cache: Path | None = None, progress: bool = False) -> nn.Module:
    """Replace every ``nn.Linear`` of a CPU float32 model by :class:`RowwiseInt8Linear`, in place.

    ``cache``: a safetensors file holding the int8 weights and scales; read when it exists (and
    matches the model's layers), written otherwise. ``progress``: a bar on stderr counting the Linear
    layers as they are replaced.
    """
    from safetensors.torch import load_file, save_file
    from tqdm.auto import tqdm

    _quiet()
    names = _linear_names(model)
    stored: dict[str, torch.Tensor] = {}
    if cache is not None and cache.exists():
        try:
            stored = load_file(str(cache))
        except Exception:  # a torn or foreign file: quantize afresh and overwrite it
            stored = {}
        if any(f"{n}.qweight" not in stored for n in names):
            stored = {}
    fresh: dict[str, torch.Tensor] = {}
    desc = "int8 (cached)" if stored else "quantizing to int8"

    def layer(name: str) -> RowwiseInt8Linear:
        linear = model.get_submodule(name)
        if stored:
            q, scale = stored[f"{name}.qweight"], stored[f"{name}.scale"]
        else:
            q, scale = quantize_weight(linear.weight)
            fresh[f"{name}.qweight"], fresh[f"{name}.scale"] = q, scale
        return RowwiseInt8Linear(q, scale, linear.bias)

    with tqdm(total=len(names), desc=desc, unit="layer", disable=not progress, dynamic_ncols=True) as bar:
        for name, made in _in_parallel(layer, names, bar):
            _set_module(model, name, made)
    use_rowwise_attention(model)
    if cache is not None and fresh:
        cache.parent.mkdir(parents=True, exist_ok=True)
        import tempfile

        # a temporary file of this process's own (two first loads never share one), renamed whole
        fd, partial = tempfile.mkstemp(prefix=f".{cache.name}.", suffix=".partial", dir=cache.parent)
        os.close(fd)
        try:
            save_file(fresh, partial, metadata={"format": FORMAT})
            os.replace(partial, cache)
        except BaseException:
            Path(partial).unlink(missing_ok=True)
            raise
    return model
