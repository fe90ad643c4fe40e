"""loosespec's model cache on disk: where it is, one process at a time per entry (``flock``), and file hashes."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

try:
    import fcntl
except ImportError:  # Windows: no flock; the temporary files are still unique per process
    fcntl = None

LOCK = ".lock"  # the lock file's name, or suffix, beside what it guards


def cache_root() -> Path:
    """``$LOOSESPEC_CACHE``, default ``~/.cache/loosespec``."""
    return Path(os.environ.get("LOOSESPEC_CACHE") or Path.home() / ".cache" / "loosespec")


@contextlib.contextmanager
def locked(lock_file: Path, what: str):
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
                log.info(f"loosespec: another process is preparing {what} (lock {lock_file}); waiting for it ...")
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        yield


def sha256_file(path: Path) -> str:
    """The sha256 of a file as it is on disk now."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def remove_files(folder: Path, keep: tuple[str, ...] = (LOCK,)) -> int:
    """Delete everything under ``folder`` but the top-level files named in ``keep`` (its lock file: a process waiting
    on it must not be left holding a lock on a file that no longer has the name, see :func:`locked`); the bytes the
    deleted files held (0 when there was nothing). Empty folders left behind go too."""
    if not folder.is_dir():
        return 0
    freed = 0
    for entry in folder.iterdir():
        if entry.name in keep and not entry.is_dir():
            continue
        if entry.is_dir() and not entry.is_symlink():
            freed += sum(f.lstat().st_size for f in entry.rglob("*") if not f.is_dir() or f.is_symlink())
            shutil.rmtree(entry)
        else:
            freed += entry.lstat().st_size
            entry.unlink()
    return freed
