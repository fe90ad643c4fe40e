"""The measured cost of a forward: ``c(n)`` = seconds for one forward over ``n`` new tokens.

Speculation pays where verifying k + 1 tokens in one forward costs little more than one token,
and how much more depends on the model, its precision, the device and the CPU (a bf16 16-token
forward cost 8.5x a 1-token forward on an AVX2 CPU, ``results/rule_cost.txt``; 2.15x in int8 on an
AVX-512 CPU, ``results/bench/cpu/cost_target.json``). So the
curve is measured, not assumed: on first use per (model, precision, device, CPU model, threads,
torch version), over a cached context of ``CONTEXT`` tokens, a few seconds, and cached as JSON in
``$LOOSESPEC_CACHE/costs/``. ``loosespec models cost NAME`` prints it; the cost-aware draft length
(:mod:`loosespec.decode.draftlen`) and ``benchmarks/rule_cost.py`` read it from here.

Between measured points ``c(n)`` is interpolated linearly; past the last one it is extrapolated
with the last segment's slope.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

CONTEXT = 128  # cached tokens before the timed forwards
REPEATS = 5  # timed forwards per point; the median is kept
POINTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
FORMAT = 1


@dataclass(frozen=True)
class CostCurve:
    """Seconds per forward over ``n`` new tokens, at the measured ``ns``."""

    ns: tuple[int, ...]
    seconds: tuple[float, ...]
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if not self.ns or len(self.ns) != len(self.seconds) or list(self.ns) != sorted(set(self.ns)):
            raise ValueError("a cost curve needs increasing, distinct n with one time each")

    def __call__(self, n: int) -> float:
        ns, ts = self.ns, self.seconds
        if n <= ns[0] or len(ns) == 1:
            return ts[0] if len(ns) == 1 else max(ts[0] + (n - ns[0]) * (ts[1] - ts[0]) / (ns[1] - ns[0]), 0.0)
        for i in range(1, len(ns)):
            if n <= ns[i]:
                a, b = ns[i - 1], ns[i]
                return ts[i - 1] + (n - a) * (ts[i] - ts[i - 1]) / (b - a)
        a, b = ns[-2], ns[-1]
        return ts[-1] + (n - b) * max(ts[-1] - ts[-2], 0.0) / (b - a)

    def ratio(self, n: int) -> float:
        """``c(n) / c(1)``: what verifying n tokens at once costs in 1-token forwards."""
        return self(n) / self(1)

    def to_dict(self) -> dict:
        return {"ns": list(self.ns), "seconds": [round(t, 6) for t in self.seconds], "meta": self.meta}

    @classmethod
    def from_dict(cls, d: dict) -> "CostCurve":
        return cls(tuple(d["ns"]), tuple(d["seconds"]), d.get("meta", {}))


def points(max_n: int) -> list[int]:
    return sorted({n for n in POINTS if n <= max_n} | {max_n})


@torch.inference_mode()
def measure(
    lm,
    max_n: int,
    *,
    context: int = CONTEXT,
    repeats: int = REPEATS,
    vocab: int | None = None,
    timer: Callable[[], float] = time.perf_counter,
    sync: Callable[[], None] = lambda: None,
    progress: Callable[[str], None] | None = None,
) -> CostCurve:
    """Time ``lm`` (a :class:`~loosespec.decode.kv.CachedLM`) over ``n = 1 .. max_n`` new tokens.

    The tokens are fixed pseudo-random ids (the cost of a forward does not depend on which ids),
    after ``context`` cached ones; one untimed forward first warms kernels and allocators. The
    model's cache is reset afterwards.
    """
    vocab = vocab or int(getattr(lm.model.config, "vocab_size", 1000))
    gen = torch.Generator().manual_seed(0)
    seq = torch.randint(min(100, vocab - 1), vocab, (context + max_n,), generator=gen)
    lm.reset()
    lm.logits(seq[:context], rows=1)  # prefill the context
    ns = points(max_n)
    for n in (1, ns[-1], 1):  # warm-up: kernels and allocators for the smallest and largest shapes
        lm.logits(seq[: context + n], rows=n)
    times: dict[int, list[float]] = {n: [] for n in ns}
    for _ in range(repeats):  # round-robin over n, so that a slow stretch of the machine hits all n alike
        for n in ns:
            sync()
            t0 = timer()
            lm.logits(seq[: context + n], rows=n)  # the cache rolls back to the context each time
            sync()
            times[n].append(timer() - t0)
    seconds = [sorted(times[n])[len(times[n]) // 2] for n in ns]
    if progress:
        progress(" ".join(f"c({n}) = {1000 * t:.1f} ms" for n, t in zip(ns, seconds)))
    lm.reset()
    return CostCurve(tuple(ns), tuple(monotone(seconds)))


def monotone(values: Sequence[float]) -> list[float]:
    """The closest non-decreasing sequence (pool adjacent violators): a forward over more tokens never
    costs less, so a dip is timing noise, averaged with its neighbours instead of kept."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    return [s / c for s, c in blocks for _ in range(c)]


def curve_key(identity: dict) -> str:
    return hashlib.sha256(json.dumps({**identity, "format": FORMAT}, sort_keys=True).encode()).hexdigest()[:20]


def model_identity(loaded, device: torch.device, forward: dict | None = None) -> dict:
    """What a cost curve depends on: the model, its precision, the machine it runs on and, for a forward that
    another library runs (llama.cpp: :attr:`loosespec.decode.gguf.GgufLM.settings`), that library's settings."""
    from loosespec.hardware import describe_device

    precision = loaded.precision.name if loaded.precision is not None else str(next(loaded.model.parameters()).dtype)
    identity = {
        "model": loaded.source.spec,
        "revision": loaded.source.revision,
        "precision": precision,
        **describe_device(device),
        "torch": torch.__version__,
    }
    if forward:
        identity["forward"] = forward
    return identity


def cost_curve(
    loaded,
    lm,
    max_n: int = 16,
    *,
    cache_dir: Path | None = None,
    refresh: bool = False,
    progress: Callable[[str], None] | None = None,
    **measure_kw,
) -> CostCurve:
    """The cached curve of ``loaded`` covering ``1 .. max_n``, measured now if there is none."""
    from loosespec.models import cache_root

    identity = model_identity(loaded, lm.device, getattr(lm, "settings", None))
    path = (cache_dir or cache_root() / "costs") / f"{curve_key(identity)}.json"
    if path.exists() and not refresh:
        try:
            curve = CostCurve.from_dict(json.loads(path.read_text()))
            if curve.ns[-1] >= max_n:
                return curve
        except (ValueError, KeyError, TypeError):  # a torn or older file: measure again
            pass
    if progress:
        progress(
            f"measuring forward cost of {loaded.source.spec} ({identity['precision']}, {identity['device']}), "
            f"once for this machine ..."
        )
    from loosespec.hardware import sync

    curve = measure(lm, max_n, sync=lambda: sync(lm.device), progress=progress, **measure_kw)
    curve = CostCurve(
        curve.ns,
        curve.seconds,
        {**identity, "context": measure_kw.get("context", CONTEXT), "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    from loosespec.fileio import atomic_write_text

    atomic_write_text(path, json.dumps(curve.to_dict(), indent=1))  # two processes measuring never share a temp file
    return curve


def format_curve(curve: CostCurve, ns: Sequence[int] | None = None) -> str:
    """A markdown table: n, c(n) in ms, c(n)/c(1)."""
    ns = ns or curve.ns
    lines = ["| n | c(n) ms | c(n)/c(1) |", "|---:|---:|---:|"]
    lines += [f"| {n} | {1000 * curve(n):.1f} | {curve.ratio(n):.2f} |" for n in ns]
    return "\n".join(lines)


def weight_bytes(model) -> int:
    """Bytes of weights one decoded token reads: every tensor of the model once, except the input embedding table
    (one row per token) unless it is also the output head (tied, as in Qwen2.5's small models).

    A llama.cpp model (:class:`~loosespec.decode.gguf.GgufModel`) is counted from its GGUF file's tensors (with
    their quantization's real sizes, scales included); a torch model from its parameters and buffers, int8 layers
    (:class:`~loosespec.quant.RowwiseInt8Linear`) as one byte per weight plus a float32 scale per row."""
    from loosespec.decode.gguf import is_gguf

    if is_gguf(model):
        from gguf import GGUFReader

        tensors = {t.name: int(t.n_bytes) for t in GGUFReader(str(model.gguf_file)).tensors}
        if "output.weight" in tensors:  # a separate head: the embedding table is read one row per token
            tensors.pop("token_embd.weight", None)
        return sum(tensors.values())
    from loosespec.quant import RowwiseInt8Linear

    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = embed is not None and head is not None and getattr(head, "weight", None) is getattr(embed, "weight", 0)
    total, seen = 0, set()
    for module in model.modules():
        if isinstance(module, RowwiseInt8Linear):
            total += module.out_features * (module.in_features + 4)
        if module is embed and not tied:
            continue
        for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            if t is not None and id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
    return total
