"""Provenance of a run: what it ran from, recorded in ``config.json``'s ``runs`` (:func:`run_provenance`).

Every run on a results folder, resumes included (a refused one adds nothing), gets an entry:
``id``, the command line, the UTC date, the loosespec version, the git commit and whether ``loosespec/`` had
uncommitted changes when it runs from a git checkout (else null), the models' sha256 or Hub revision where
known and the evaluation files' sha256; each row names its run (``run_id``). ``runs`` is not part of the
configuration a resumed run must match. Nothing here loads a model or raises for what it cannot read.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

GIT_TIMEOUT_S = 5.0


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# the files each evaluation set's loader reads (loosespec.eval.datasets), hashed into every run's provenance
DATASET_FILES: dict[str, tuple[str, ...]] = {
    "gsm8k": ("gsm8k_test.jsonl",),
    "gsm8k-train": ("gsm8k_train.jsonl",),
    "mgsm": ("mgsm.jsonl",),
    "math500": ("math500_test.jsonl",),
    "humaneval": ("humaneval.jsonl",),
    "mbpp-train": ("mbpp.jsonl",),
    "specbench": ("spec_bench_question.jsonl",),
    "mtbench": ("mt_bench_question.jsonl",),
    "niah": ("paul_graham_essays.jsonl",),
}


@functools.lru_cache(maxsize=256)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of a file (remembered per process while its size and mtime stay)."""
    st = os.stat(path)
    return _sha256_of(os.path.realpath(path), st.st_size, st.st_mtime_ns)


def _git(args: Sequence[str], cwd: Path) -> str | None:
    try:
        r = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def source_checkout() -> dict:
    """``git_commit`` and ``git_dirty`` (uncommitted changes, untracked files included, under ``loosespec/`` or
    in ``pyproject.toml``) of the checkout loosespec runs from; both None when it does not run from one (an
    installed wheel), git is missing or slow (:data:`GIT_TIMEOUT_S`)."""
    import loosespec

    pkg = Path(loosespec.__file__).resolve().parent
    top = _git(["rev-parse", "--show-toplevel"], pkg)
    if top is None or Path(top).resolve() != pkg.parent:  # e.g. installed into a venv inside another repository
        return {"git_commit": None, "git_dirty": None}
    commit = _git(["rev-parse", "HEAD"], pkg.parent)
    status = None if commit is None else _git(["status", "--porcelain", "--", pkg.name, "pyproject.toml"], pkg.parent)
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def _hub_revision(repo_id: str) -> str | None:
    """The commit of a Hub model's copy in the local Hugging Face cache (no network), or None."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # not installed, a malformed id: unknown
        return None
    return Path(found).parent.name if isinstance(found, str) else None


def model_provenance(spec: str | None, revision: str | None = None) -> dict | None:
    """What a model spec named when the run started, read without loading or preparing anything: an embedded
    model's pinned GGUF sha256 (``revision``) and the provenance its conversion recorded (``converted``, None before
    it is prepared), a ``.gguf`` file's sha256, a local directory's files' sha256 (``files``), a Hub id's revision
    (the one asked for, else the commit of its copy in the local Hugging Face cache, else None). Never raises:
    what cannot be read is recorded as ``error``."""
    if spec is None:
        return None
    try:
        from loosespec.weights.convert import READY_MARKER
        from loosespec.weights.embedded import EMBEDDED, hf_dir

        if spec in EMBEDDED:
            e = EMBEDDED[spec]
            marker = hf_dir(spec) / READY_MARKER
            return {
                "spec": spec,
                "kind": "embedded",
                "revision": e.sha256,
                "gguf_sha256": e.sha256,
                "original_id": e.original_id,
                "converted": json.loads(marker.read_text(encoding="utf-8")) if marker.is_file() else None,
            }
        p = Path(spec).expanduser()
        if spec.endswith(".gguf") and p.is_file():
            sha = file_sha256(p)
            return {"spec": spec, "kind": "gguf", "path": str(p.resolve()), "revision": sha, "gguf_sha256": sha}
        if p.is_dir():
            files = {f.name: file_sha256(f) for f in sorted(p.iterdir()) if f.is_file() and not f.name.startswith(".")}
            return {"spec": spec, "kind": "local", "path": str(p.resolve()), "revision": "local", "files": files}
        return {
            "spec": spec,
            "kind": "hub",
            "revision": revision or _hub_revision(spec),
            "requested_revision": revision,
        }
    except Exception as e:  # provenance never stops a run
        return {"spec": spec, "error": f"{type(e).__name__}: {e}"}


def data_provenance(dataset: str, data_dir: str | Path | None = None) -> dict:
    """The files the dataset's loader reads (:data:`DATASET_FILES`), each with where it was read from and its
    sha256 (a Hub copy: its source, revision unknown); an unknown set records nothing. Never raises."""
    from loosespec.eval.datafiles import HUB, HUB_SOURCES, data_file

    out = {}
    for name in DATASET_FILES.get(dataset, ()):
        try:
            where = data_file(name, data_dir)
            if where == HUB:
                repo, config, split = HUB_SOURCES[name]
                out[name] = {"hub": repo, "config": config, "split": split, "revision": None}
            else:
                out[name] = {"path": str(Path(where).resolve()), "sha256": file_sha256(Path(where))}
        except Exception as e:  # a file that is not there is the loader's error to report, not provenance's
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    return out


def run_provenance(
    config: dict, *, data_dir: str | Path | None = None, argv: Sequence[str] | None = None, sandbox: str | None = None
) -> dict:
    """One run's entry in config.json's ``runs``: ``id`` (each row's ``run_id``), ``argv`` (``sys.argv``),
    ``date`` (UTC, ISO 8601), ``loosespec`` (the version), ``git_commit`` / ``git_dirty``
    (:func:`source_checkout`), ``models`` (``target`` and ``draft``, :func:`model_provenance`; a Hub id's revision
    asked for is the config's ``target_revision`` / ``draft_revision`` where it has one) and
    ``data_files`` (:func:`data_provenance`), and ``sandbox``, the mode model-written code ran in (a set that runs
    none: absent). Nothing here is compared on resume."""
    from loosespec import __version__

    return {
        "id": uuid.uuid4().hex[:12],
        "argv": list(sys.argv if argv is None else argv),
        "date": _utc_now(),
        "loosespec": __version__,
        **source_checkout(),
        "models": {
            role: model_provenance(config.get(role), config.get(f"{role}_revision")) for role in ("target", "draft")
        },
        "data_files": data_provenance(config.get("dataset", ""), data_dir),
        **({} if sandbox is None else {"sandbox": sandbox}),
    }
