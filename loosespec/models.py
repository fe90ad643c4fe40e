"""Model loading: a model spec (an embedded model, a ``.gguf`` file, a local directory or a Hugging Face id)
resolved to a folder ``from_pretrained`` reads (:func:`resolve`) and loaded with its tokenizer (:func:`load`).

Where the weights come from lives in :mod:`loosespec.weights`: the embedded models and their preparation
(:mod:`~loosespec.weights.embedded`: ``loosespec models pull``), the one-time GGUF -> safetensors conversion
(:mod:`~loosespec.weights.convert`), the cache folder, its locks and hashes (:mod:`~loosespec.weights.store`).
This module is the public entry: the registry names the CLI and the engine use are importable from here too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from loosespec.errors import LoosespecError
from loosespec.hardware import Precision, resolve_precision
from loosespec.weights.convert import READY_MARKER, convert_gguf, gguf_cache_dir
from loosespec.weights.embedded import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    EMBEDDED,
    gguf_file,
    list_models,
    pull,
    verified_gguf,
)
from loosespec.weights.store import LOCK, cache_root, locked

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "DTYPES",
    "EMBEDDED",
    "LoadedModel",
    "ModelSource",
    "cache_root",
    "check_revision",
    "gguf_path",
    "has_gguf",
    "list_models",
    "load",
    "pick_device",
    "pull",
    "remove",
    "resolve",
    "same_tokenizer",
    "spec_kind",
]


@dataclass(frozen=True)
class ModelSource:
    """Where a model spec points: a directory or hub id that ``from_pretrained`` accepts."""

    spec: str  # what the user typed
    kind: str  # embedded | gguf | local | hub
    path: str  # argument for from_pretrained
    revision: str  # sha256 of the GGUF, or the hub commit (resolved, once loaded), or "local"
    requested_revision: str | None = None  # hub ids: the --revision asked for (a branch, tag or commit); None: none

    def provenance(self) -> dict:
        """What identifies the weights, for a run's record: the spec, its kind, the revision (an embedded
        model's pinned GGUF sha256, a Hub id's resolved commit), the revision asked for (Hub ids), and the
        GGUF's sha256 where one was converted."""
        out = {"spec": self.spec, "kind": self.kind, "revision": self.revision}
        if self.kind == "hub":
            out["requested_revision"] = self.requested_revision
        if self.kind == "embedded":
            out["gguf_sha256"] = self.revision
        elif self.kind == "gguf":
            try:
                marker = json.loads((Path(self.path) / READY_MARKER).read_text())
            except (OSError, ValueError):
                marker = {}
            out["gguf_sha256"] = marker.get("gguf_sha256")  # None: converted before loosespec recorded it
        return out


def spec_kind(spec: str) -> str:
    """What a model spec names, without loading or preparing anything: ``embedded`` | ``gguf`` (a ``.gguf``
    path) | ``local`` (a directory) | ``path`` (a path that is not a model, or not there) | ``hub``."""
    if spec in EMBEDDED:
        return "embedded"
    if spec.endswith(".gguf"):
        return "gguf"
    p = Path(spec).expanduser()
    if p.is_dir():
        return "local"
    if p.exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        return "path"
    return "hub"


def check_revision(spec: str, revision: str | None, flag: str = "--revision") -> None:
    """A revision applies to Hugging Face Hub ids only: an embedded model is pinned by its sha256, a file or a
    directory is what it is. Checked before anything is loaded."""
    if revision is None:
        return
    if not revision.strip():
        raise LoosespecError(f"{flag} must not be empty")
    kind = spec_kind(spec)
    if kind != "hub":
        what = {
            "embedded": "an embedded model, pinned by the sha256 of its GGUF",
            "gguf": "a .gguf file",
            "local": "a local directory",
        }.get(kind, "a path")
        raise LoosespecError(f"{flag} applies to Hugging Face Hub ids only; '{spec}' is {what}")


def resolve(spec: str, progress: bool = True, revision: str | None = None) -> ModelSource:
    """Map a model spec (embedded name, ``.gguf`` file, local dir, HF id) to a loadable location.
    ``revision``: a Hub id's branch, tag or commit (:func:`check_revision`)."""
    check_revision(spec, revision)
    kind = spec_kind(spec)
    if kind == "embedded":
        return ModelSource(spec, "embedded", str(pull(spec, progress)), EMBEDDED[spec].sha256)
    p = Path(spec).expanduser()
    if kind == "gguf":
        if not p.is_file():
            raise LoosespecError(f"GGUF file not found: {spec}")
        out = gguf_cache_dir(p)
        if not (out / READY_MARKER).exists():
            with locked(out.with_name(f".{out.name}{LOCK}"), str(p)):
                if not (out / READY_MARKER).exists():  # another process converted it while this one waited
                    if progress:
                        log.info(f"converting {p} to safetensors (once) ...")
                    convert_gguf(p, out, {"gguf_file": str(p.resolve())}, progress=progress, name=p.name)
        return ModelSource(spec, "gguf", str(out), "gguf:" + out.name)
    if kind == "local":
        if not (p / "config.json").exists():
            raise LoosespecError(f"{spec} is a directory without config.json, not a model")
        return ModelSource(spec, "local", str(p), "local")
    if kind == "path":
        raise LoosespecError(f"model path not found or not a model: {spec}")
    return ModelSource(spec, "hub", spec, "", revision)


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

    @property
    def provenance(self) -> dict:
        """:meth:`ModelSource.provenance`: what identifies these weights (for a run's ``config.json``)."""
        return self.source.provenance()


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


_NO_SAFETENSORS = "cannot be loaded with `safetensors`"  # transformers' OSError for use_safetensors=True


def _hub_commit(repo_id: str, revision: str | None, offline: bool) -> str | None:
    """The commit a Hub repository's ``revision`` (None: its default branch) points to now: a commit hash as is,
    else asked of the Hub, else (offline) read from the local Hugging Face cache's refs; None when none of them
    knows (the load then reports why). Loading at the commit keeps the model and its tokenizer on one state of
    the repository, and is what gets recorded."""
    if revision is not None and len(revision) == 40 and all(c in "0123456789abcdef" for c in revision):
        return revision
    try:
        from huggingface_hub import HfApi, try_to_load_from_cache

        if not offline:
            return HfApi().model_info(repo_id, revision=revision).sha
        found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
        return Path(found).parent.name if isinstance(found, str) else None
    except Exception:  # an unknown repo or revision, a gated one: the load's own error says which
        return None


@contextlib.contextmanager
def _no_hub_conversion():
    """transformers answers ``use_safetensors=True`` on a branch with only ``.bin`` weights by loading the Hub
    conversion bot's pull request (``refs/pr/N``) instead: other weights than the revision named, and a commit
    that is not the one recorded. Off while loosespec loads; the repository's own safetensors or an error."""
    key = "DISABLE_SAFETENSORS_CONVERSION"
    old = os.environ.get(key)
    os.environ[key] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def _progress_bars(show: bool):
    """transformers' progress bars off unless ``show``, and with them huggingface_hub's (transformers turns the Hub's
    bars, its downloads', off and on with its own); returns what puts both back as they were: bars off before (an
    application's choice, HF_HUB_DISABLE_PROGRESS_BARS=1) stay off."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    ours, hubs = hf_logging.is_progress_bar_enabled(), not are_progress_bars_disabled()
    if show or not (ours or hubs):
        return lambda: None
    hf_logging.disable_progress_bar()

    def restore() -> None:
        if ours:
            with warnings.catch_warnings():  # HF_HUB_DISABLE_PROGRESS_BARS=1 refuses the Hub's, warning each time
                warnings.simplefilter("ignore")
                hf_logging.enable_progress_bar()
        if hubs:
            enable_progress_bars()  # on (HF_HUB_DISABLE_PROGRESS_BARS is not 1: they were on), whatever transformers' were
        else:
            disable_progress_bars()

    return restore


def load(
    spec: str,
    dtype: str = "auto",
    device: str = "auto",
    progress: bool = True,
    quantize: str = "auto",
    role: str = "target",
    revision: str | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer from any spec ``resolve`` accepts, in eval mode.

    ``dtype``/``quantize``: ``auto`` picks the precision from the hardware
    (:func:`loosespec.hardware.resolve_precision`); ``quantize="int8"`` replaces the Linear layers by
    per-token int8 ones (:mod:`loosespec.quant`), cached after the first load; ``quantize="w4a16"`` by 4-bit
    ones (:class:`loosespec.quant.W4A16Linear`), quantized at load; ``quantize="int4"`` runs the GGUF
    file itself in llama.cpp (:mod:`loosespec.decode.gguf`). ``role``: ``target``, ``draft`` or ``torch`` (a model
    something will run in transformers); ``auto`` may pick int4 for the first two
    (:func:`~loosespec.hardware.resolve_precision`).

    A Hugging Face Hub id loads at ``revision`` (a branch, tag or commit; ``None``: the default branch, whose
    commit is printed and recorded in ``source.revision``), safetensors weights only: a repository with only
    PyTorch ``.bin`` pickles is an error saying how to convert it. The tokenizer comes from the model's commit.
    ``revision`` for any other kind of spec is an error (:func:`check_revision`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_revision(spec, revision)  # before anything is loaded or prepared
    dev = pick_device(device)
    precision = resolve_precision(dtype, quantize, dev, gguf=has_gguf(spec), role=role)
    src = resolve(spec, progress, revision)
    if precision.quantize == "int4":
        return _load_gguf(spec, src, precision, progress)
    kw, model_kw, offline, commit = {}, {}, False, None
    if src.kind == "hub":
        offline = _hub_unreachable(spec)
        commit = _hub_commit(spec, revision, offline)
        # model and tokenizer from the one commit, even if the branch moves in between
        kw = {"local_files_only": offline, "revision": commit or revision}
        model_kw = {"use_safetensors": True}
    # a folder on disk loads in seconds: its per-tensor bars are noise; a Hub id shows the Hub's download bars
    restore_bars = _progress_bars(show=progress and src.kind == "hub")
    try:
        with _no_hub_conversion() if src.kind == "hub" else contextlib.nullcontext():
            model = AutoModelForCausalLM.from_pretrained(src.path, dtype=precision.torch_dtype, **kw, **model_kw)
        tokenizer = AutoTokenizer.from_pretrained(src.path, **kw)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if src.kind == "hub" and _NO_SAFETENSORS in str(e):
            at = f" at revision {revision}" if revision else ""
            where = " in the local Hugging Face cache (the Hub is unreachable)" if offline else ""
            raise LoosespecError(
                f"'{spec}'{at} has no safetensors weights{where}, and loosespec loads Hub weights as safetensors "
                "only (a PyTorch .bin file is a pickle, which can run code when loaded): convert it once yourself "
                "(transformers' from_pretrained(..., use_safetensors=False), then save_pretrained(DIR) for the "
                "model and its tokenizer) and pass DIR as the model"
            ) from e
        known = ", ".join(EMBEDDED)
        raise LoosespecError(
            f"cannot load model '{spec}': not an embedded model ({known}), a .gguf file or a local "
            f"model directory, and loading it as a Hugging Face id failed: {first}"
        ) from e
    finally:
        restore_bars()
    model.to(dev).eval()
    if src.kind == "hub":
        commit = commit or _hub_commit(spec, revision, True) or ""  # now in the local cache, if not resolved before
        src = ModelSource(src.spec, src.kind, src.path, commit, revision)
        if progress and revision is None and commit:
            log.info(
                f"loosespec: {spec} loaded at commit {commit} (no --revision given: pass --revision {commit} "
                "to load exactly these weights again)"
            )
    if precision.quantize == "int8":
        from loosespec.quant import quantize_model

        cache = _int8_cache(src)
        if progress and cache is not None and not cache.exists():
            log.info(f"quantizing {spec} to int8 (once; cached) ...")
        quantize_model(model, cache, progress=progress)
    elif precision.quantize == "w4a16":
        from loosespec.quant import quantize_model_w4

        quantize_model_w4(model, progress=progress)
    return LoadedModel(src, model, tokenizer, precision)


def _int8_cache(src: ModelSource) -> Path:
    """The file caching a model's int8 weights (:func:`loosespec.quant.quantize_model`), keyed by where it was loaded
    from and its revision."""
    from loosespec.quant import cache_file

    key = f"{src.kind}|{src.path}|{src.revision}"
    if src.kind == "local":  # a directory can change under the same path: its weight files are the key
        key += "|" + ";".join(
            f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}"
            for f in sorted(Path(src.path).glob("*"))
            if f.suffix in (".safetensors", ".bin")
        )
    return cache_file(cache_root() / "int8", key)


def remove(name: str) -> int:
    """Remove a prepared embedded model from the cache: its GGUF, its conversion (:func:`loosespec.weights.embedded.
    remove`) and its cached int8 weights; the bytes freed (0: nothing was prepared). An unknown name is a
    :class:`~loosespec.errors.LoosespecError` listing the known ones."""
    from loosespec.weights.embedded import hf_dir
    from loosespec.weights.embedded import remove as remove_files

    int8 = (
        _int8_cache(ModelSource(name, "embedded", str(hf_dir(name)), EMBEDDED[name].sha256))
        if name in EMBEDDED
        else None
    )
    freed = remove_files(name)  # the unknown name's error, and the model's lock
    if int8 is not None and int8.is_file():
        freed += int8.stat().st_size
        int8.unlink()
    return freed


def gguf_path(spec: str) -> Path | None:
    """The GGUF file behind a model spec: an embedded model's assembled file, or a ``.gguf`` path; None for a
    directory or a hub id (whether the file exists yet is the caller's to check)."""
    if spec in EMBEDDED:
        return gguf_file(spec)
    return Path(spec).expanduser() if spec.endswith(".gguf") else None


def has_gguf(spec: str) -> bool:
    """Whether a model spec names a GGUF file llama.cpp can run (an embedded model, or a ``.gguf`` path)."""
    return gguf_path(spec) is not None


def _load_gguf(spec: str, src: ModelSource, precision: Precision, progress: bool = True) -> LoadedModel:
    """A model whose forward llama.cpp runs on the GGUF file itself (``--quantize int4``): the tokenizer, config
    and generation config come from the converted directory, the weights stay in the GGUF
    (:class:`loosespec.decode.gguf.GgufModel`). An embedded model's GGUF is re-hashed against its pin first
    (:func:`verified_gguf`): llama.cpp runs that file, not the verified conversion."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from loosespec.decode.gguf import GgufModel

    path = verified_gguf(spec, progress) if src.kind == "embedded" else gguf_path(spec)
    try:
        generation = GenerationConfig.from_pretrained(src.path)
    except OSError:  # no generation_config.json: the model's defaults
        generation = None
    model = GgufModel(path, AutoConfig.from_pretrained(src.path), generation)
    return LoadedModel(src, model, AutoTokenizer.from_pretrained(src.path), precision)


def same_tokenizer(a, b) -> bool:
    """True when two tokenizers map every string to the same ids (same vocabulary and merges)."""
    return a.get_vocab() == b.get_vocab()
