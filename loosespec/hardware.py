"""What machine this is, and the precision that follows from it (``--dtype auto``).

Speculative decoding pays only where a forward over k + 1 tokens costs little more than a forward
over one. That depends on the hardware, which differs between machines of the same cloud type
from one day to the next, so the choice is made at run time from what the machine reports:

- a CUDA device: bfloat16 where it supports it (Ampere and newer), else float16;
- Apple MPS: float16;
- an x86 CPU with torch's int8 engine: int8 weights (per output channel) with int8 activations scaled per
  token (:mod:`loosespec.quant`), the non-linear parts in float32. For Qwen2.5-Coder-1.5B a 16-token
  forward cost 8.5x a 1-token forward in bfloat16 on a 2-core AVX2 EPYC (``results/rule_cost.txt``)
  and 2.15x in int8 on a 2-core AVX-512 Xeon without bf16 (``results/bench/cpu/cost_target.json``);
  ``loosespec models cost`` measures it on yours. Also on CPUs with bfloat16 arithmetic (``amx_bf16``,
  ``avx512_bf16``): there a bfloat16 verify forward is cheap, but no row of a 16-row bfloat16 forward
  was bit-equal to the 1-token forward at its position (so ``exact`` would not equal ``ar``), and a
  1-token forward, which reads twice int8's bytes, was slower (``benchmarks/forward_cost.py`` on an
  AMX Xeon, ``results/forward/``); ``--dtype bfloat16`` still asks for it;
- a CPU with bfloat16 arithmetic and ``--quantize none`` (or no int8 engine): bfloat16;
- any other CPU without an int8 engine in torch (neither ``fbgemm`` nor ``x86``): float32.

:class:`Precision` records what was chosen and why; it travels into ``--json``'s ``config``, the
statistics line and bench results, next to the CPU model and the flags that decided it.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import torch

from loosespec.errors import LoosespecError

# CPU flags that matter for the precision choice and that every timing records
FLAGS_OF_NOTE = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile")
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
DTYPE_CHOICES = ("auto", "bfloat16", "float16", "float32")
QUANTIZE_CHOICES = ("auto", "none", "int8", "w4a16", "int4")


@dataclass(frozen=True)
class CpuInfo:
    model: str
    flags: frozenset[str]
    arch: str

    @property
    def bf16(self) -> bool:
        return any(f in self.flags for f in BF16_FLAGS)

    def flags_of_note(self) -> list[str]:
        return [f for f in FLAGS_OF_NOTE if f in self.flags]


def parse_cpuinfo(text: str, arch: str = "x86_64") -> CpuInfo:
    """CPU model and flags from the text of ``/proc/cpuinfo`` (the first processor's)."""
    model, flags = "unknown CPU", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and model == "unknown CPU":
            model = value.strip()
        elif key in ("flags", "features") and not flags:  # x86 says flags, arm64 features
            flags = frozenset(value.split())
    return CpuInfo(model, flags, arch)


@lru_cache(maxsize=1)
def cpu_info() -> CpuInfo:
    """This machine's CPU (``/proc/cpuinfo`` on Linux; the platform's processor string elsewhere)."""
    path = Path("/proc/cpuinfo")
    if path.exists():
        return parse_cpuinfo(path.read_text(errors="replace"), platform.machine())
    return CpuInfo(platform.processor() or platform.machine() or "unknown CPU", frozenset(), platform.machine())


def int8_engine() -> str | None:
    """torch's quantized engine that runs the int8 path on this CPU, or None."""
    engines = torch.backends.quantized.supported_engines
    for name in ("x86", "fbgemm"):
        if name in engines:
            return name
    return None


@dataclass(frozen=True)
class Precision:
    """How a model's weights and arithmetic are stored: ``dtype`` of the unquantized parts and
    ``quantize`` (``none`` | ``int8`` | ``w4a16`` | ``int4``) of the Linear layers; ``name`` is the short label.
    ``w4a16``: 4-bit weights per group, bfloat16 activations, torch's packed int4 CPU kernel
    (:class:`loosespec.quant.W4A16Linear`); ``int4``: the model's own GGUF weights (4-bit K-quants) run by
    llama.cpp (:mod:`loosespec.decode.gguf`)."""

    dtype: str
    quantize: str
    reason: str

    @property
    def name(self) -> str:
        return self.quantize if self.quantize in ("int8", "w4a16", "int4") else self.dtype

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def to_dict(self) -> dict:
        return {**asdict(self), "name": self.name}


def sync(device: torch.device) -> None:
    """Wait for queued device work so wall-clock timers measure it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def cuda_bf16_native(device: torch.device | str = "cuda") -> bool:
    """Whether a CUDA device computes in bfloat16 natively: compute capability 8.0 (Ampere) or newer.
    ``torch.cuda.is_bf16_supported()`` also answers True where bfloat16 is only emulated (a T4 or V100 runs
    it many times slower than float16, and some kernels lack it), so the capability decides; on ROCm,
    where capabilities mean something else, torch's answer stands."""
    if getattr(torch.version, "hip", None):
        return bool(torch.cuda.is_bf16_supported())
    major, _ = torch.cuda.get_device_capability(torch.device(device))
    return major >= 8


def describe_device(device: torch.device, cpu: CpuInfo | None = None) -> dict:
    """What a timing ran on: the CPU model and flags of note, and the GPU when there is one."""
    cpu = cpu or cpu_info()
    out = {
        "device": str(device),
        "cpu": cpu.model,
        "cpu_flags": cpu.flags_of_note(),
        "arch": cpu.arch,
        "threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


def _gpu_name(device: torch.device) -> str:
    try:
        major, minor = torch.cuda.get_device_capability(device)
        return f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor})"
    except Exception:  # no CUDA here (tests pass cuda_bf16 explicitly)
        return str(device)


def resolve_precision(
    dtype: str = "auto",
    quantize: str = "auto",
    device: torch.device | str = "cpu",
    cpu: CpuInfo | None = None,
    cuda_bf16: bool | None = None,
    engine: str | None | bool = False,
    gguf: bool = False,
    llamacpp: bool | None = None,
    role: str = "target",
) -> Precision:
    """The precision ``--dtype``/``--quantize`` ask for on this device, with the reason.

    ``gguf``: the model has a GGUF file (an embedded model or a ``.gguf`` path), which llama.cpp can run in its own
    4-bit weights; ``llamacpp``: llama-cpp-python is installed. ``role``: ``target``, ``draft`` or ``torch`` (a model
    that something will run as a transformers model: SpecGuard's attentions, transformers' ``generate`` peers). With
    ``quantize="auto"`` on a CPU, a target or a draft with a GGUF goes to llama.cpp (int4) where it is installed: its
    1-token forward is the cheapest measured (``benchmarks/forward_cost.py``, results/forward/), a draft's rounding
    cannot change what the target accepts, and a target's verify rows are bit-equal to its one-token forwards as
    :mod:`loosespec.decode.gguf` runs llama.cpp (measured there and in ``tests/decode/test_gguf.py``). Without
    llama.cpp, or for ``torch``, int8 (where torch has its int8 engine). ``cpu``, ``cuda_bf16``, ``engine`` and
    ``llamacpp`` default to what this machine reports; tests pass fixtures.
    """
    if dtype not in DTYPE_CHOICES:
        raise LoosespecError(f"unknown dtype '{dtype}'; choose one of: {', '.join(DTYPE_CHOICES)}")
    if quantize not in QUANTIZE_CHOICES:
        raise LoosespecError(f"unknown quantize '{quantize}'; choose one of: {', '.join(QUANTIZE_CHOICES)}")
    device = torch.device(device)
    if engine is False:
        engine = int8_engine()
    if llamacpp is None:  # installed, without importing it (the import loads a shared library)
        import importlib.util

        llamacpp = importlib.util.find_spec("llama_cpp") is not None
    if quantize == "int4":
        if device.type != "cpu":
            raise LoosespecError(
                f"--quantize int4 runs the GGUF weights in llama.cpp on the CPU; on {device.type} use --quantize none"
            )
        if dtype not in ("auto", "float32"):
            raise LoosespecError(
                f"--quantize int4 runs in llama.cpp, which returns float32 logits; --dtype {dtype} "
                "cannot go with it (use --dtype auto or float32)"
            )
        if not gguf:
            raise LoosespecError(
                "--quantize int4 runs a GGUF file in llama.cpp: use an embedded model or a .gguf "
                "file, or --quantize int8"
            )
        if not llamacpp:
            raise LoosespecError(
                "--quantize int4 runs the GGUF weights in llama.cpp and needs llama-cpp-python "
                "(builds from source, 10-20 min): make peers, or pip install 'loosespec[peers]'"
            )
        return Precision("float32", "int4", "int4 asked for (--quantize int4): the GGUF's own weights in llama.cpp")
    if quantize == "w4a16":
        from loosespec.quant import w4a16_supported

        if device.type != "cpu":
            raise LoosespecError(
                f"--quantize w4a16 runs torch's packed int4 CPU kernel; on {device.type} use --quantize none"
            )
        if not w4a16_supported():
            raise LoosespecError(
                f"--quantize w4a16 needs torch's packed int4 CPU kernel (_weight_int4pack_mm_for_cpu), which torch "
                f"{torch.__version__} lacks; use --quantize int8"
            )
        if dtype not in ("auto", "float32"):
            raise LoosespecError(
                f"--quantize w4a16 computes the unquantized parts in float32; --dtype {dtype} "
                "cannot go with it (use --dtype auto or float32)"
            )
        return Precision(
            "float32",
            "w4a16",
            "w4a16 asked for (--quantize w4a16): 4-bit weights per group of 32, bfloat16 activations, "
            "each row computed alone (lossless methods stay equal to ar within it)",
        )
    if quantize == "int8":
        if device.type != "cpu":
            raise LoosespecError(
                f"--quantize int8 runs on the CPU only (torch's {engine or 'fbgemm'} kernels); "
                f"on {device.type} use --quantize none"
            )
        if engine is None:
            raise LoosespecError(
                "--quantize int8 needs torch's x86/fbgemm quantized engine, which this torch "
                "build lacks; use --quantize none"
            )
        if dtype not in ("auto", "float32"):
            raise LoosespecError(
                f"--quantize int8 computes the unquantized parts in float32; --dtype {dtype} "
                "cannot go with it (use --dtype auto or float32)"
            )
        return Precision("float32", "int8", "int8 asked for (--quantize int8)")
    if device.type == "cuda" and cuda_bf16 is None and dtype in ("auto", "bfloat16"):
        cuda_bf16 = cuda_bf16_native(device)
    if dtype == "bfloat16" and device.type == "cuda" and not cuda_bf16:
        raise LoosespecError(
            f"--dtype bfloat16 on {_gpu_name(device)}: this GPU (before Ampere, compute capability "
            "< 8.0) has no bfloat16 arithmetic; use --dtype auto (float16) or float32"
        )
    if dtype != "auto":
        return Precision(dtype, "none", f"--dtype {dtype} asked for")
    if device.type == "cuda":
        if cuda_bf16:
            return Precision("bfloat16", "none", "CUDA device with bfloat16 support")
        return Precision(
            "float16",
            "none",
            "CUDA device without native bfloat16 (pre-Ampere, compute capability "
            "< 8.0); float16, whose overflow to NaN loosespec reports as an error",
        )
    if device.type == "mps":
        return Precision("float16", "none", "Apple MPS device")
    if quantize == "auto" and role in ("target", "draft") and gguf and llamacpp:
        if role == "draft":
            why = "a draft only proposes, and its rounding cannot change what the target accepts"
        else:
            why = (
                "batch-invariant as loosespec runs llama.cpp (loosespec.decode.gguf), so lossless methods stay "
                "token-identical to ar"
            )
        return Precision(
            "float32",
            "int4",
            f"a GGUF {role} with llama.cpp installed: its 4-bit forward reads about 0.63 of int8's bytes, and its "
            f"1-token forward was cheaper than int8's wherever both were timed (benchmarks/forward_cost.py); {why}",
        )
    cpu = cpu or cpu_info()
    if quantize == "auto" and engine is not None:
        if cpu.bf16:
            flags = "/".join(f for f in BF16_FLAGS if f in cpu.flags)
            return Precision(
                "float32",
                "int8",
                f"int8 weights with per-token int8 activations, although this CPU has bfloat16 arithmetic "
                f"({flags}): bfloat16's matmuls round a row differently alone and inside a verify batch, "
                "so lossless methods would leave ar, and a 1-token forward reads twice int8's bytes "
                "(benchmarks/forward_cost.py measures both; --dtype bfloat16 asks for it)",
            )
        return Precision(
            "float32",
            "int8",
            "CPU has no bfloat16 arithmetic (no amx_bf16/avx512_bf16): bf16 is emulated there and a "
            "verify forward costs many 1-token forwards; int8 weights with per-token int8 activations "
            "keep it cheap (loosespec models cost measures it)",
        )
    if cpu.bf16:
        flags = "/".join(f for f in BF16_FLAGS if f in cpu.flags)
        why = "--quantize none" if quantize == "none" else "no int8 engine in this torch"
        return Precision("bfloat16", "none", f"CPU has bfloat16 arithmetic ({flags}) and {why}")
    return Precision("float32", "none", "CPU has no bfloat16 arithmetic and no int8 engine requested or available")


def memory_bandwidth(kind: str = "copy", size_mib: int = 512, repeats: int = 5, threads: int | None = None) -> float:
    """This machine's memory bandwidth in GB/s, over arrays far larger than any cache, on ``threads`` threads
    (default: torch's); the median of ``repeats`` passes.

    ``copy``: a plain streaming copy (STREAM's *copy*: bytes read plus bytes written). ``read``: a sum over one
    array (bytes read), which is what a decode step does to the weights. Decoding one token reads every weight
    once, so ``bytes per token / read bandwidth`` is about the least time a 1-token forward can take here
    (issue 42; :func:`loosespec.cost.weight_bytes`)."""
    import time

    if kind not in ("copy", "read"):
        raise ValueError(f"kind must be copy or read, got {kind!r}")
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        src = torch.ones(size_mib << 18)  # float32: size_mib MiB
        dst = torch.empty_like(src)
        dst.copy_(src)  # touch every page once before timing
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            if kind == "copy":
                dst.copy_(src)
            else:
                src.sum()
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    moved = (2 if kind == "copy" else 1) * src.numel() * src.element_size()
    return moved / sorted(times)[len(times) // 2] / 1e9
