"""How the models are loaded: every model-loading option declared once, here.

Each field of :class:`LoadConfig` is declared with :func:`load_option`: its default and help text (and, where the
command line needs more, its flag and bounds). Everything else derives from that one declaration, as the decoding
knobs derive from :mod:`loosespec.config`: the options of every command that loads models (``generate``, ``bench``,
``serve``, ``calibrate``, ``models cost``: :func:`loosespec.cli.options.load_options`) and the keywords of
:meth:`loosespec.decode.engine.Engine.load`. Adding a loading option is one :func:`load_option` line (plus the code
that uses it, in :meth:`~loosespec.decode.engine.Engine.load_from`).

Values are checked where they are used (:func:`loosespec.hardware.resolve_precision`, :func:`loosespec.models.load`,
:func:`loosespec.decode.engine.check_cache_options`), before any model loads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from loosespec.decode.kv import DEFAULT_MAX_CACHE_LEN
from loosespec.models import DEFAULT_DRAFT, DEFAULT_TARGET

DTYPE_HELP = (
    "auto | bfloat16 | float16 | float32. auto: bfloat16 on CUDA (float16 before Ampere); on x86 CPUs "
    "float32 with int8 Linear layers (see --quantize), also where amx_bf16/avx512_bf16 would allow "
    "bfloat16, whose batched matmuls leave lossless methods unequal to ar"
)
QUANTIZE_HELP = (
    "auto | none | int8 | w4a16 | int4. int8: Linear layers in int8 (weights per channel, activations per "
    "token; lossless methods stay equal to ar within it), CPU only; w4a16: 4-bit weights per group of 32 with "
    "bfloat16 activations (torch's packed int4 CPU kernel, transformers' int4_weight_only), about 0.63 of int8's bytes, "
    "each row computed alone so lossless methods stay equal to ar within it, CPU only; int4: the GGUF's own 4-bit weights "
    "run by llama.cpp (embedded models and .gguf files; needs llama-cpp-python: make peers), CPU only, "
    "no SpecGuard or hf-* peers; run so that a verify row equals a 1-token forward, lossless methods stay "
    "equal to ar in it; auto (with --dtype auto, on a CPU): int4 for a GGUF model where llama-cpp-python is "
    "installed and nothing needs it in transformers (SpecGuard, hf-* peers), else int8 where torch has its "
    "int8 engine"
)
DRAFT_QUANTIZE_HELP = (
    "auto | none | int8 | w4a16 | int4: the draft model's --quantize. auto: as --quantize when that is "
    "given; with --quantize auto, int4 (llama.cpp) for a GGUF draft where llama-cpp-python is "
    "installed (a draft only proposes: its rounding cannot change what the target accepts), "
    "else as the target"
)
CACHE_HELP = (
    "dynamic | static (transformers' cache_implementation). static: the KV cache preallocated at "
    "--max-cache-len positions, rolled back in place (full-attention models; not specguard); needed by "
    "--compile"
)
COMPILE_HELP = (
    "torch.compile the draft steps and verifies on the static cache, padded to fixed lengths (CUDA "
    "graphs on a GPU). Off by default: compiling costs minutes on a CPU, and GPUs are yet to be measured "
    "(docs/gpu.md)"
)
MAX_CACHE_HELP = "Positions of the static cache: at least prompt + new tokens + 32 (--cache-implementation static)."


@dataclass(frozen=True)
class LoadOption:
    """What a loading option is, beyond its name, type and default (all kept by the dataclass field)."""

    help: str
    flag: Optional[str] = None  # the CLI declaration, when not --<name> (e.g. a --x/--no-x pair)
    bounds: dict = field(default_factory=dict)  # the CLI's bounds (click's min, max)


def load_option(default: Any, help: str, *, flag: Optional[str] = None, **bounds) -> Any:
    """A :class:`LoadConfig` field with its :class:`LoadOption` metadata."""
    return field(default=default, metadata={"load": LoadOption(help, flag, bounds)})


@dataclass(frozen=True)
class LoadConfig:
    """Which models to load and how: precision, device, KV cache.

    Every field is a loading option (:func:`load_option`), declared once with its help; the CLI commands that load
    models and :meth:`Engine.load <loosespec.decode.engine.Engine.load>` derive their options from these
    declarations.
    """

    target: str = load_option(DEFAULT_TARGET, "Target model: embedded name, HF id, local dir or .gguf file.")
    draft: Optional[str] = load_option(
        "auto",
        f"Draft model (same forms as --target), or 'none'. 'auto': "
        f"{DEFAULT_DRAFT} for the default target, none for other targets.",
    )
    revision: Optional[str] = load_option(
        None,
        "Hugging Face Hub revision (branch, tag or commit) of a --target given as a Hub id; its commit is "
        "recorded. Hub weights load as safetensors only. An error for an embedded model (pinned by sha256), a .gguf "
        "file or a local directory.",
    )
    draft_revision: Optional[str] = load_option(None, "--revision for a --draft given as a Hub id.")
    dtype: str = load_option("auto", DTYPE_HELP)
    quantize: str = load_option("auto", QUANTIZE_HELP)
    draft_quantize: str = load_option("auto", DRAFT_QUANTIZE_HELP)
    device: str = load_option("auto", "auto | cpu | cuda | cuda:N | mps")
    cache_implementation: str = load_option("dynamic", CACHE_HELP)
    compile: bool = load_option(False, COMPILE_HELP, flag="--compile/--no-compile")
    max_cache_len: int = load_option(DEFAULT_MAX_CACHE_LEN, MAX_CACHE_HELP, min=1)

    @property
    def draft_model(self) -> Optional[str]:
        """The draft to load: ``none`` (or None) -> None; ``auto`` -> the default draft for the default target, else
        None; any other spec as given."""
        if self.draft is None or self.draft.lower() == "none":
            return None
        if self.draft.lower() == "auto":
            return DEFAULT_DRAFT if self.target == DEFAULT_TARGET else None
        return self.draft

    def replace(self, **changes) -> "LoadConfig":
        return dataclasses.replace(self, **changes)


LOAD_OPTIONS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(LoadConfig)}
CACHE_OPTIONS = ("cache_implementation", "compile", "max_cache_len")  # the KV cache's (the engine's decode loop)


def load_option_info(name: str) -> LoadOption:
    return LOAD_OPTIONS[name].metadata["load"]
