"""A GGUF file dequantized once into a safetensors folder (transformers reads the GGUF), which then loads in
seconds; the folder's ready marker records the GGUF's sha256."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

import torch

from loosespec.errors import LoosespecError
from loosespec.fileio import _umask, atomic_write_text
from loosespec.weights.store import cache_root, sha256_file

CONVERTED_DTYPE = torch.float32  # dequantized weights are stored exactly, cast at load time
READY_MARKER = "loosespec-converted.json"  # written last, into a finished conversion folder

_BAR_LOCK = threading.Lock()
# transformers' own bars while it converts, as loosespec names them: (step, unit)
_STEPS = {
    "Converting and de-quantizing GGUF tensors...": ("dequantize", "tensor"),
    "Loading weights": ("load", "tensor"),
    "Writing model shards": ("write", "shard"),
}


@contextlib.contextmanager
def _conversion_bars(desc: str, progress: bool):
    """transformers shows bars of its own while it converts a GGUF: "Converting and de-quantizing GGUF tensors"
    (the module-level ``tqdm`` of ``transformers.modeling_gguf_pytorch_utils``, always on; one step per GGUF
    tensor), "Loading weights" (one step per weight) and "Writing model shards" (through its ``set_tqdm_hook``).
    While loosespec converts, they are loosespec's: ``<desc>: dequantize``, ``<desc>: load``, ``<desc>: write``,
    on stderr only with ``progress``, as the package's other bars. Conversions in one process take turns (both
    hooks are global); a transformers without them keeps its own bars."""
    from tqdm.auto import tqdm
    from transformers.utils import logging as hf_logging

    try:
        from transformers import modeling_gguf_pytorch_utils as legacy
    except ImportError:
        legacy = None

    def bar(iterable=None, *args, **kwargs):
        theirs = kwargs.get("desc") or ""
        step, unit = _STEPS.get(theirs, (theirs or "convert", "it"))
        kwargs.update(desc=f"{desc}: {step}", unit=unit, disable=not progress, dynamic_ncols=True)
        return tqdm(iterable, *args, **kwargs)

    with _BAR_LOCK:
        hooked, previous_hook = hasattr(hf_logging, "set_tqdm_hook"), None
        if hooked:
            previous_hook = hf_logging.set_tqdm_hook(lambda factory, args, kwargs: bar(*args, **kwargs))
        legacy_bar = getattr(legacy, "tqdm", None)
        if legacy_bar is not None:
            legacy.tqdm = bar
        try:
            yield
        finally:
            if legacy_bar is not None:
                legacy.tqdm = legacy_bar
            if hooked:
                hf_logging.set_tqdm_hook(previous_hook)


def convert_gguf(
    gguf_file: Path,
    out_dir: Path,
    provenance: dict,
    sha256: str | None = None,
    progress: bool = False,
    name: str | None = None,
) -> Path:
    """Dequantize a GGUF with transformers and save it as safetensors + tokenizer in ``out_dir``.

    The GGUF is hashed after transformers has read it, and its sha256 goes into the ready marker
    (``gguf_sha256``); with ``sha256`` (the pin) a file that no longer matches is an error and no marker is
    written. The conversion is written into a temporary folder of this call's own, renamed to ``out_dir`` at the
    end; the caller serializes conversions into one ``out_dir`` (:func:`loosespec.weights.store.locked`).
    ``progress``: bars on stderr counting the tensors as transformers dequantizes and loads them, and the files
    it writes, named after ``name`` (default: the file's name); without it, none (:func:`_conversion_bars`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = Path(gguf_file)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", suffix=".partial", dir=out_dir.parent))
    try:
        with _conversion_bars(f"convert {name or gguf_file.name}", progress):
            try:
                tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
                model = AutoModelForCausalLM.from_pretrained(
                    gguf_file.parent, gguf_file=gguf_file.name, dtype=CONVERTED_DTYPE
                )
            except Exception as e:  # transformers raises many types for unsupported GGUF layouts
                raise LoosespecError(f"cannot convert GGUF {gguf_file}: {type(e).__name__}: {e}") from e
            actual = sha256_file(gguf_file)  # what was converted: the file as it is after transformers read it
            if sha256 is not None and actual != sha256:
                raise LoosespecError(
                    f"{gguf_file}: sha256 is {actual}, expected {sha256} (it changed while it "
                    "was converted); not marked ready: run the command again"
                )
            # A GGUF-loaded model carries a quantizer marker that blocks save_pretrained; the weights are
            # already dequantized tensors, so the marker is dropped before saving.
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(tmp_dir)
            tokenizer.save_pretrained(tmp_dir)
        os.chmod(tmp_dir, 0o777 & ~_umask())  # mkdtemp's 0700 would hide the cache from the user's other accounts
        atomic_write_text(tmp_dir / READY_MARKER, json.dumps({**provenance, "gguf_sha256": actual}, indent=2))
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp_dir.replace(out_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return out_dir


def gguf_cache_dir(gguf_file: Path) -> Path:
    """The conversion folder of a ``.gguf`` file given by path: one per file path, size and modification time."""
    st = gguf_file.stat()
    key = hashlib.sha256(f"{gguf_file.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root() / "gguf" / f"{gguf_file.stem}-{key}"
