"""The files of a results folder: ``results.jsonl`` (:class:`ResultsFile`), ``config.json`` (:func:`run_config`,
:func:`check_config`), the run's lock (:class:`RunLock`, :func:`open_run`), and the Spec-Bench export.

``DIR/config.json`` holds what the numbers depend on (models, dtype, device, dataset and its options, token
budget, sampling, seed, SpecGuard's tau); running a different configuration into the same DIR is an error.
Its ``runs`` lists every run's provenance (:mod:`loosespec.eval.provenance`), not compared on resume.

One run writes a folder at a time: ``bench`` takes an exclusive lock (``fcntl.flock`` on ``DIR/results.lock``,
without waiting; :class:`RunLock`, :func:`open_run`) for the whole run and writes its pid into that file. A
second ``bench --out DIR`` while the first runs fails at once with one line naming DIR and the holder's pid.
:func:`unique_rows` keeps one row per repeated (question, method) pair (a row with a verdict before one whose
scoring failed, else the first written) and warns how many were repeated.

Reading never changes the folder: a torn last line (a run killed mid-write, or a line a running writer is still
finishing) is skipped with a warning by every reader (``loosespec report``, :mod:`loosespec.eval.failures`).
Only the run holding the lock repairs one: it moves the torn line to ``results.jsonl.corrupt`` and truncates
it off, and that (question, method) pair runs again. A damaged line elsewhere is an error. ``report`` writes
``summary.json`` and the plots only when no run holds the folder (else it prints the table and leaves them to
that run). Every file that is replaced (``config.json``, ``summary.json``, the plots, the Spec-Bench export)
is written whole through a temporary file and a rename (:func:`loosespec.fileio.atomic_write_text`); a
``config.json`` that is not JSON is a one-line error naming it. Rows whose scoring failed are replaced in place
(:meth:`ResultsFile.replace`): ``results.jsonl`` rewritten whole through a temporary file and a rename, every
other line byte for byte. Rows written before ``score_status`` existed read as right/wrong/unscored from
``score`` (:func:`score_status`).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import warnings
import weakref
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from loosespec.config import knob_default
from loosespec.errors import LoosespecError
from loosespec.eval.provenance import _utc_now, run_provenance
from loosespec.eval.scoring import VERDICT_STATUSES
from loosespec.fileio import atomic_write_bytes, atomic_write_text
from loosespec.methods import FLY_WINDOW_MEANING

try:
    import fcntl
except ImportError:  # Windows: msvcrt's byte-range lock instead
    fcntl = None

RESULTS = "results.jsonl"
# ``ar`` run again in a later sitting (process start) on a problem it already has a row for: the baseline a method
# timed in that sitting is paired with, and the check that ar's outputs reproduce across sittings (read_reruns)
RERUNS = "reruns.jsonl"
SUMMARY = "summary.json"
CONFIG = "config.json"
LOCK = "results.lock"  # the run's lock (RunLock): holds the holder's pid while a run writes the folder
RUNS = "runs"  # config.json's provenance of every run on the folder (run_provenance): not compared on resume


_HELD: "weakref.WeakValueDictionary[str, RunLock]" = weakref.WeakValueDictionary()  # folders this process locks


def _folder_key(out: Path) -> str:
    return os.path.realpath(out)


def _try_lock(fd: int) -> bool:
    """Take the exclusive lock on ``fd`` without waiting; False when another open file holds it."""
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:  # pragma: no cover - Windows
            import msvcrt

            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except (BlockingIOError, PermissionError):
        return False
    except OSError as e:
        import errno

        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK, errno.EDEADLK):  # EDEADLK: msvcrt's "held"
            return False
        raise
    return True


def _unlock(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
    else:  # pragma: no cover - Windows
        import msvcrt

        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)


def lock_holder(out: Path) -> str:
    """Who holds ``DIR``'s lock, as its file says (``pid 123, loosespec bench since ...``), for messages."""
    try:
        info = json.loads((Path(out) / LOCK).read_text(encoding="utf-8"))
        return f"pid {info['pid']}, {info.get('command', 'a run')} since {info.get('since', '?')}"
    except (OSError, ValueError, KeyError, TypeError):
        return "pid unknown"


class RunLock:
    """The exclusive lock of one run on a results folder: ``fcntl.flock`` on ``DIR/results.lock``, taken without
    waiting, held until :meth:`release` (or the process ends: the system drops a dead process's lock, so a run
    killed with -9 leaves nothing to clean up). The lock file holds the holder's pid, command and start while it
    is held; it is never deleted (deleting a lock file lets two runs lock two different files).

    A process locks a folder once: the harness's writers (:func:`run_bench`, :func:`rescore_errors`,
    :func:`check_config`, :meth:`ResultsFile.repair`) use the lock this process already holds, or take it for
    their own duration. ``rows``, ``run_id`` and ``rescored`` carry :func:`open_run`'s state."""

    def __init__(self, out: Path, command: str = "loosespec bench"):
        self.out = Path(out)
        self.path = self.out / LOCK
        self.command = command
        self.run_id: str | None = None
        self.rows: list[dict] = []
        self.rescored: set[tuple[str, str]] = set()  # pairs scored again under this lock (once per run)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; False (nothing changed) when another run does."""
        key = _folder_key(self.out)
        mine = _HELD.get(key)
        if mine is not None:
            raise LoosespecError(f"{self.out} is already locked by this process ({mine.command})")
        self.out.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            if not _try_lock(fd):
                os.close(fd)
                return False
            info = {"pid": os.getpid(), "command": self.command, "since": _utc_now()}
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, (json.dumps(info) + "\n").encode())
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        _HELD[key] = self
        return True

    def acquire(self) -> "RunLock":
        """Take the lock, or fail at once with one line naming the folder and the holder's pid."""
        if not self.try_acquire():
            raise LoosespecError(
                f"{self.out} is being written by another run ({lock_holder(self.out)}); two runs "
                f"on one folder would append the same pairs twice: wait for it, or use another --out"
            )
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if _HELD.get(_folder_key(self.out)) is self:
            del _HELD[_folder_key(self.out)]
        try:
            os.ftruncate(fd, 0)  # a finished run's pid names no holder
            _unlock(fd)
        except OSError:
            pass
        finally:
            os.close(fd)  # closing drops the lock in any case

    def __enter__(self) -> "RunLock":
        return self if self.held else self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass


@contextlib.contextmanager
def _writing(out: Path) -> Iterator[RunLock]:
    """The lock this process holds on ``out``, or the lock taken for the block (one line if another run holds it)."""
    held = _HELD.get(_folder_key(out))
    if held is not None:
        yield held
        return
    with RunLock(out).acquire() as lock:
        yield lock


@contextlib.contextmanager
def _derived_writes(out: Path) -> Iterator[str | None]:
    """May this process replace ``out``'s derived files (summary.json, plots)? Yields None when it may (it holds
    the folder's lock, no run ever locked the folder, or the lock is free and taken for the block), else who holds
    it: a reader leaves a folder that a run is writing as it is. No lock file is created here."""
    if _folder_key(out) in _HELD or not (Path(out) / LOCK).exists():
        yield None
        return
    lock = RunLock(out, "loosespec report")
    try:
        free = lock.try_acquire()
    except OSError:  # a folder this user cannot lock: read-only, so nobody writes it
        free = True
    if not free:
        yield lock_holder(out)
        return
    try:
        yield None
    finally:
        lock.release()


@dataclass
class _Scan:
    rows: list[dict]
    spans: list[tuple[int, int]]  # each row's line, byte offsets without its newline
    data: bytes
    torn: tuple[int, int, str] | None  # (line number, bytes before it, why) of a torn last line


class ResultsFile:
    """``DIR/results.jsonl``: one flushed line per result.

    :meth:`read` never changes the file (a torn last line is skipped with a warning); :meth:`repair` and
    :meth:`replace` are the writer's, under the folder's lock (:class:`RunLock`); :meth:`append` is called by
    the run that holds it. ``run_id``: the run whose rows :func:`_record` appends (config.json's ``runs``)."""

    def __init__(self, path: Path, run_id: str | None = None):
        self.path = Path(path)
        self.run_id = run_id

    def _scan(self) -> _Scan:
        if not self.path.exists():
            return _Scan([], [], b"", None)
        data = self.path.read_bytes()
        rows, spans, pos = [], [], 0
        lines = data.split(b"\n")
        for i, raw in enumerate(lines):
            end = pos + len(raw)
            is_last = all(not x.strip() for x in lines[i + 1 :])
            if raw.strip():
                try:
                    row = json.loads(raw)
                    if not isinstance(row, dict):
                        raise ValueError("not a JSON object")
                    if i == len(lines) - 1:  # no trailing newline: the write did not finish
                        raise ValueError("unterminated line")
                except ValueError as e:
                    if not is_last:
                        raise LoosespecError(
                            f"{self.path}: line {i + 1} is damaged ({e}) and is not the last line; "
                            f"repair or remove it before resuming"
                        ) from None
                    return _Scan(rows, spans, data, (i + 1, pos, str(e)))
                rows.append(row)
                spans.append((pos, end))
            pos = end + 1
        return _Scan(rows, spans, data, None)

    def read(self) -> list[dict]:
        """Every complete row. Changes nothing: a torn last line (a run killed mid-write, or one a running writer
        is finishing) is skipped with a warning; the run that next holds the lock repairs it."""
        scan = self._scan()
        if scan.torn is not None:
            line_no, _, why = scan.torn
            warnings.warn(
                f"{self.path}: skipped a torn last line {line_no} ({why}); a run may still be writing it. "
                f"Nothing was changed (the next `loosespec bench` on this folder repairs it)",
                stacklevel=2,
            )
        return scan.rows

    def repair(self) -> list[dict]:
        """The writer's read, under the folder's lock: a torn last line is moved to ``results.jsonl.corrupt`` and
        truncated off (its pair runs again); returns the rows."""
        with _writing(self.path.parent):
            scan = self._scan()
            if scan.torn is not None:
                line_no, keep, why = scan.torn
                self._drop_tail(scan.data[keep:], line_no, keep, why)
            return scan.rows

    def _drop_tail(self, tail: bytes, line_no: int, keep: int, why: str) -> None:
        corrupt = self.path.with_name(self.path.name + ".corrupt")
        with open(corrupt, "ab") as f:
            f.write(tail if tail.endswith(b"\n") else tail + b"\n")
            f.flush()
            os.fsync(f.fileno())
        with open(self.path, "r+b") as f:
            f.truncate(keep)
        warnings.warn(
            f"{self.path}: dropped a torn last line {line_no} ({why}); it was saved to {corrupt} "
            f"and its (question, method) pair will run again",
            stacklevel=3,
        )

    def replace(self, new: dict[int, dict]) -> None:
        """Replace rows by their index in :meth:`repair`'s list: the file is rewritten whole through a temporary
        file and a rename, every other line byte for byte. Under the folder's lock."""
        with _writing(self.path.parent):
            scan = self._scan()
            if scan.torn is not None:
                raise LoosespecError(f"{self.path}: a torn last line must be repaired before rows are replaced")
            if any(not 0 <= i < len(scan.rows) for i in new):
                raise LoosespecError(f"{self.path}: no row {sorted(new)} to replace")
            out, pos = [], 0
            for i in sorted(new):
                start, end = scan.spans[i]
                out += [scan.data[pos:start], json.dumps(new[i], ensure_ascii=False, default=str).encode("utf-8")]
                pos = end
            atomic_write_bytes(self.path, b"".join(out) + scan.data[pos:])

    def append(self, row: dict) -> None:
        line = json.dumps(row, ensure_ascii=False, default=str) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def score_status(row: dict) -> str:
    """A row's verdict: its ``score_status``, or for rows written before it existed, ``score`` read as
    right (True), wrong (False) or unscored (None)."""
    status = row.get("score_status")
    if status in VERDICT_STATUSES:
        return status
    score = row.get("score")
    return "unscored" if score is None else ("right" if score else "wrong")


def unique_rows(rows: Sequence[dict], where: str = "results", warn: bool = True) -> tuple[list[dict], int]:
    """One row per (question_id, method), in file order: a row with a verdict is kept before one whose scoring
    failed, else the first written. Warns when a pair is repeated (two runs appended to one folder) and
    returns (rows, how many repeated rows were left out)."""
    keep: dict[tuple[str, str], int] = {}
    out: list[dict] = []
    for r in rows:
        key = (r["question_id"], r["method"])
        if key not in keep:
            keep[key] = len(out)
            out.append(r)
        elif score_status(out[keep[key]]) == "error" and score_status(r) != "error":
            out[keep[key]] = r
    repeated = len(rows) - len(out)
    if repeated and warn:
        warnings.warn(
            f"{where}: {repeated} repeated (question, method) pair row(s) (two runs appended to one "
            f"folder?): each pair is counted once",
            stacklevel=2,
        )
    return out, repeated


def read_reruns(out: Path) -> list[dict]:
    """``DIR/reruns.jsonl``'s rows (``ar`` run again in a later sitting; :data:`RERUNS`), [] when there is none.
    Read like ``results.jsonl``: nothing changes, a torn last line is skipped with a warning."""
    path = Path(out) / RERUNS
    return ResultsFile(path).read() if path.is_file() else []


# keys that directories written before they existed lack, and the value those runs had: a directory whose FLy rows
# counted the mismatch in fly_window_size cannot be resumed with today's meaning (rows of both would mix)
LEGACY_WINDOW_MEANING = "counting the mismatch"
LEGACY_CONFIG = {"adaptive_draft_length": False, "fly_window_meaning": LEGACY_WINDOW_MEANING}
PROVENANCE_KEYS = (RUNS,)  # in config.json, not compared on resume


def read_config(out: Path) -> dict:
    """``DIR/config.json``; one line naming the file when it is not a JSON object (torn, hand-edited)."""
    path = Path(out) / CONFIG
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise LoosespecError(
            f"{path} is damaged ({e.msg} at line {e.lineno} column {e.colno}): restore it from a "
            f"copy (it names the settings {path.parent}'s results ran with) or use another "
            f"--out"
        ) from None
    except UnicodeDecodeError as e:
        raise LoosespecError(
            f"{path} is damaged (not UTF-8 text: {e.reason}): restore it from a copy or use another --out"
        ) from None
    if not isinstance(data, dict):
        raise LoosespecError(f"{path} is damaged (not a JSON object): restore it from a copy or use another --out")
    return data


def _dump_config(config: dict) -> str:
    return json.dumps(config, indent=1, sort_keys=True) + "\n"


def check_config(out: Path, config: dict, provenance: dict | None = None) -> None:
    """Write ``DIR/config.json`` on the first run; later runs must match it key for key (``runs``, the
    provenance, aside). ``provenance`` (:func:`run_provenance`) is added to ``runs``; nothing recorded is
    overwritten. Written whole (temporary file and rename), under the folder's lock."""
    out = Path(out)
    path = out / CONFIG
    config = {k: v for k, v in config.items() if k not in PROVENANCE_KEYS}
    with _writing(out):
        if path.exists():
            stored = read_config(out)
            old = {
                **{k: v for k, v in LEGACY_CONFIG.items() if k in config},
                **{k: v for k, v in stored.items() if k not in PROVENANCE_KEYS},
            }
            if "draft_dtype" in config and "draft_dtype" not in old:  # written before the draft had its own precision
                old["draft_dtype"] = old.get("dtype") if old.get("draft") else None
            diff = sorted(k for k in set(old) | set(config) if old.get(k) != config.get(k))
            if diff:
                lines = "; ".join(f"{k}: {old.get(k)!r} there, {config.get(k)!r} now" for k in diff)
                raise LoosespecError(
                    f"{out} holds results of a different configuration ({lines}); "
                    f"use another --out directory, or rerun with the same settings"
                )
            if provenance is not None:
                runs = stored.get(RUNS) if isinstance(stored.get(RUNS), list) else []
                atomic_write_text(path, _dump_config({**stored, RUNS: runs + [provenance]}))
            return
        atomic_write_text(path, _dump_config({**config, **({RUNS: [provenance]} if provenance is not None else {})}))


def open_run(
    out: Path,
    config: dict,
    *,
    data_dir: str | Path | None = None,
    command: str = "loosespec bench",
    sandbox: str | None = None,
) -> RunLock:
    """Start a run on ``DIR``: take its lock (one line naming DIR and the holder's pid if another run holds it),
    check ``config`` against ``config.json`` and record this run's provenance there (:func:`run_provenance`),
    and repair a torn last line of ``results.jsonl``. Returns the held :class:`RunLock` (``rows``: the results
    so far; ``run_id``: this run's entry in ``runs``); release it at the end (``with`` or :meth:`RunLock.release`;
    the system releases it when the process ends). ``sandbox``: the mode model-written code is scored in, if
    any, recorded with the run."""
    lock = RunLock(out, command).acquire()
    try:
        provenance = run_provenance(config, data_dir=data_dir, sandbox=sandbox)
        check_config(out, config, provenance)
        lock.run_id = provenance["id"]
        lock.rows = ResultsFile(Path(out) / RESULTS).repair()
    except BaseException:
        lock.release()
        raise
    return lock


SPEC_BENCH_KEYS = ("question_id", "category", "model_id", "choices", "tstamp")
SPEC_BENCH_MT_TASK = "mt_bench"  # the task type a specbench row of MT-Bench's 80 questions is grouped under


def _spec_bench_question_categories() -> dict[str, str]:
    """Each Spec-Bench question's own category (MT-Bench's eight for questions 81..160), by problem id."""
    from loosespec.eval.loaders import specbench

    return {p.id: p.meta["category"] for p in specbench()}


def export_spec_bench(rows: Sequence[dict], dest: Path) -> list[Path]:
    """One ``<method>.jsonl`` per method with Spec-Bench's answer-file fields only (``question_id``,
    ``category``, ``model_id``, ``choices[0]`` with ``turns``, ``new_tokens``, ``wall_time``,
    ``accept_lengths``, ``decoding_steps``), the layout its ``evaluation/speed.py`` reads; pass
    ``ar.jsonl`` as its baseline file.

    speed.py selects a task's rows by ``category``: its MT-Bench line by MT-Bench's own eight categories
    (writing, roleplay, ..., humanities), the other lines by task name (translation, ..., rag). A specbench row
    is grouped under its task type (``mt_bench`` for MT-Bench's questions), so those rows are written with their
    question's category from Spec-Bench's question file; every other row keeps its own."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    by_method: dict[str, list[dict]] = defaultdict(list)
    own: dict[str, str] | None = None
    for r in unique_rows(rows, "the rows exported to Spec-Bench's layout")[0]:
        item = {k: r[k] for k in SPEC_BENCH_KEYS}
        if r["category"] == SPEC_BENCH_MT_TASK:
            own = _spec_bench_question_categories() if own is None else own
            if r["question_id"] not in own:
                raise LoosespecError(
                    f"cannot export {r['question_id']} to Spec-Bench's layout: Spec-Bench's question file "
                    "(spec_bench_question.jsonl) has no such question, so its MT-Bench category is unknown"
                )
            item["category"] = own[r["question_id"]]
        by_method[r["method"]].append(item)
    paths = []
    for m, items in by_method.items():
        paths.append(dest / f"{m}.jsonl")
        atomic_write_text(paths[-1], "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in items))
    return paths


def run_config(
    *,
    target: str,
    draft: str | None,
    dtype: str,
    device: str,
    dataset: str,
    options: dict,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    seed: int,
    sg_tau: float | None,
    scorer: str,
    adaptive_draft_length: bool = knob_default("adaptive_draft_length"),
    draft_dtype: str | None = None,
) -> dict:
    """What the numbers in a results directory depend on (compared on every resume). ``draft_dtype``: the draft's
    precision (None: the target's, or no draft)."""
    import torch
    import transformers

    from loosespec import __version__

    return {
        "target": target,
        "draft": draft,
        "dtype": dtype,
        "device": device,
        "dataset": dataset,
        "draft_dtype": None if draft is None else draft_dtype or dtype,
        "dataset_options": options,
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "seed": seed,
        "sg_tau": sg_tau,
        "scorer": scorer,
        "adaptive_draft_length": adaptive_draft_length,
        "fly_window_meaning": FLY_WINDOW_MEANING,
        "loosespec": __version__,
        "torch": torch.__version__.split("+")[0],
        "transformers": transformers.__version__,
        "machine": platform.machine(),
    }
