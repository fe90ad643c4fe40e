"""Precision chosen from what the machine is: CPU flags from /proc/cpuinfo fixtures, CUDA absent or present."""

from pathlib import Path

import pytest

from loosespec.errors import LoosespecError
from loosespec.hardware import cpu_info, parse_cpuinfo, resolve_precision

FIX = Path(__file__).parent / "fixtures"


def cpu(name: str, arch: str = "x86_64"):
    return parse_cpuinfo((FIX / f"cpuinfo_{name}.txt").read_text(), arch)


def test_parse_cpuinfo_reads_model_and_first_processors_flags():
    epyc = cpu("epyc_zen3")
    assert epyc.model == "AMD EPYC 7B13"
    assert "avx2" in epyc.flags and "fma" in epyc.flags  # the first processor's line, not the second's
    assert not epyc.bf16
    assert epyc.flags_of_note() == ["avx2"]
    spr = cpu("sapphire_rapids_amx")
    assert spr.bf16 and {"amx_bf16", "avx512_bf16", "avx512_vnni"} <= set(spr.flags_of_note())
    arm = cpu("graviton", "aarch64")
    assert arm.model == "unknown CPU" and "asimd" in arm.flags and not arm.bf16


def test_avx2_cpu_gets_int8():
    p = resolve_precision("auto", "auto", "cpu", cpu=cpu("epyc_zen3"), engine="x86")
    assert (p.dtype, p.quantize, p.name) == ("float32", "int8", "int8")
    assert "no bfloat16 arithmetic" in p.reason


def test_amx_cpu_gets_int8_too():
    """bfloat16 arithmetic is not enough: its batched matmuls are not batch-invariant (exact would leave ar) and a
    1-token forward reads twice int8's bytes (benchmarks/forward_cost.py on an AMX Xeon, results/forward/)."""
    p = resolve_precision("auto", "auto", "cpu", cpu=cpu("sapphire_rapids_amx"), engine="x86")
    assert (p.dtype, p.quantize, p.name) == ("float32", "int8", "int8")
    assert "amx_bf16" in p.reason and "ar" in p.reason and "--dtype bfloat16" in p.reason


def test_bfloat16_cpu_without_int8_gets_bfloat16():
    amx = cpu("sapphire_rapids_amx")
    unquantized = resolve_precision("auto", "none", "cpu", cpu=amx, engine="x86")
    assert (unquantized.name, unquantized.quantize) == ("bfloat16", "none") and "--quantize none" in unquantized.reason
    no_engine = resolve_precision("auto", "auto", "cpu", cpu=amx, engine=None)
    assert no_engine.name == "bfloat16" and "no int8 engine" in no_engine.reason
    assert resolve_precision("bfloat16", "auto", "cpu", cpu=amx, engine="x86").name == "bfloat16"


def test_cpu_without_int8_engine_gets_float32():
    p = resolve_precision("auto", "auto", "cpu", cpu=cpu("graviton", "aarch64"), engine=None)
    assert p.name == "float32"


def test_quantize_none_keeps_float32_on_avx2():
    assert resolve_precision("auto", "none", "cpu", cpu=cpu("epyc_zen3"), engine="x86").name == "float32"


def test_explicit_dtype_wins_and_int8_can_be_forced():
    assert resolve_precision("bfloat16", "auto", "cpu", cpu=cpu("epyc_zen3"), engine="x86").name == "bfloat16"
    forced = resolve_precision("auto", "int8", "cpu", cpu=cpu("sapphire_rapids_amx"), engine="x86")
    assert forced.name == "int8"


def test_cuda_precision_follows_bf16_support():
    assert resolve_precision("auto", "auto", "cuda", cuda_bf16=True, engine="x86").name == "bfloat16"
    assert resolve_precision("auto", "auto", "cuda", cuda_bf16=False, engine="x86").name == "float16"


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(dtype="auto", quantize="int8", device="cuda"), "CPU only"),
        (dict(dtype="bfloat16", quantize="int8", device="cpu"), "float32"),
        (dict(dtype="int4", quantize="auto", device="cpu"), "unknown dtype"),
        (dict(dtype="auto", quantize="int2", device="cpu"), "unknown quantize"),
        (dict(dtype="auto", quantize="int4", device="cpu", gguf=False, llamacpp=True), "GGUF file"),
        (dict(dtype="auto", quantize="int4", device="cpu", gguf=True, llamacpp=False), "llama-cpp-python"),
        (dict(dtype="auto", quantize="int4", device="cuda", gguf=True, llamacpp=True), "on the CPU"),
        (dict(dtype="bfloat16", quantize="int4", device="cpu", gguf=True, llamacpp=True), "float32 logits"),
        (dict(dtype="auto", quantize="w4a16", device="cuda"), "packed int4 CPU kernel"),
        (dict(dtype="bfloat16", quantize="w4a16", device="cpu"), "float32"),
    ],
)
def test_bad_combinations_are_clear_errors(kw, words):
    with pytest.raises(LoosespecError, match=words):
        resolve_precision(**kw, cpu=cpu("epyc_zen3"), engine="x86")


def test_w4a16_is_asked_for_never_chosen_by_auto(monkeypatch):
    """w4a16 only where asked: measured end to end no faster than int8 on the CPU it ran on (BENCHMARKS.md, "w4a16"),
    so auto keeps int8 on every CPU; a torch without the kernel is a clear error."""
    for name in ("epyc_zen3", "sapphire_rapids_amx"):
        assert resolve_precision("auto", "auto", "cpu", cpu=cpu(name), engine="x86").name == "int8"
        p = resolve_precision("auto", "w4a16", "cpu", cpu=cpu(name), engine="x86")
        assert (p.name, p.dtype, p.quantize) == ("w4a16", "float32", "w4a16")
    import loosespec.quant

    monkeypatch.setattr(loosespec.quant, "w4a16_supported", lambda: False)
    with pytest.raises(LoosespecError, match="lacks"):
        resolve_precision("auto", "w4a16", "cpu", cpu=cpu("epyc_zen3"), engine="x86")


def test_int8_without_engine_is_refused():
    with pytest.raises(LoosespecError, match="quantized engine"):
        resolve_precision("auto", "int8", "cpu", cpu=cpu("epyc_zen3"), engine=None)


def test_this_machine_is_described():
    me = cpu_info()
    assert me.model and isinstance(me.flags, frozenset)


@pytest.mark.parametrize(
    "capability, auto", [((7, 5), "float16"), ((7, 0), "float16"), ((8, 0), "bfloat16"), ((9, 0), "bfloat16")]
)
def test_cuda_auto_reads_the_compute_capability_not_emulated_bf16(monkeypatch, capability, auto):
    """torch.cuda.is_bf16_supported() says True on a T4 or V100 too (emulation); --dtype auto must pick float16
    there and bfloat16 from Ampere on. Stand-ins for the CUDA queries: no GPU is needed."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Stand-in GPU")
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert resolve_precision("auto", "auto", "cuda", engine="x86").name == auto
    assert resolve_precision("float16", "auto", "cuda", engine="x86").name == "float16"
    if auto == "float16":
        with pytest.raises(
            LoosespecError, match=r"bfloat16 on Stand-in GPU \(compute capability 7\.\d\).*--dtype auto"
        ):
            resolve_precision("bfloat16", "auto", "cuda", engine="x86")
    else:
        assert resolve_precision("bfloat16", "auto", "cuda", engine="x86").name == "bfloat16"


@pytest.mark.parametrize("machine", ["epyc_zen3", "sapphire_rapids_amx"])
def test_auto_runs_gguf_models_in_llamacpp_unless_transformers_must_run_them(machine):
    """A draft only proposes, and a target's verify rows are bit-equal to its one-token forwards as loosespec runs
    llama.cpp (tests/decode/test_gguf.py), so auto takes llama.cpp's cheaper forward for both where it is installed;
    a model that transformers must run (role "torch": SpecGuard, hf-* peers) keeps the torch precision."""
    kw = dict(cpu=cpu(machine), engine="x86", gguf=True, llamacpp=True)
    for role in ("target", "draft"):
        p = resolve_precision("auto", "auto", "cpu", role=role, **kw)
        assert (p.name, p.quantize) == ("int4", "int4") and "llama.cpp" in p.reason and role in p.reason
    torch_side = resolve_precision("auto", "auto", "cpu", role="torch", **kw)
    assert torch_side.name in ("int8", "bfloat16")
    for other in (dict(kw, llamacpp=False), dict(kw, gguf=False)):  # no llama.cpp, or no GGUF: as for torch
        for role in ("target", "draft"):
            assert resolve_precision("auto", "auto", "cpu", role=role, **other).name == torch_side.name
    assert resolve_precision("auto", "int8", "cpu", role="draft", **kw).name == "int8"  # asked for: kept
    assert resolve_precision("float32", "auto", "cpu", **kw).name == "float32"  # a dtype asked for: no llama.cpp
    assert resolve_precision("auto", "auto", "cuda", cuda_bf16=True, **kw).name == "bfloat16"  # a GPU: never


def test_memory_bandwidth_counts_what_each_kind_moves(monkeypatch):
    """copy moves the array twice (read and write), read once: with a clock that advances one second per call
    around each pass, the two kinds differ by exactly that factor."""
    import loosespec.hardware as hw

    ticks = iter(range(1000))
    monkeypatch.setattr("time.perf_counter", lambda: float(next(ticks)))
    mib = 1 << 20
    assert hw.memory_bandwidth("copy", size_mib=4, repeats=3) == pytest.approx(2 * 4 * mib / 1e9)
    assert hw.memory_bandwidth("read", size_mib=4, repeats=3) == pytest.approx(4 * mib / 1e9)
    with pytest.raises(ValueError, match="copy or read"):
        hw.memory_bandwidth("write")
