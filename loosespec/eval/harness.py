"""Benchmark and evaluation harness: speed and accuracy of every method, side by side with peers.

``loosespec bench --dataset NAME --out DIR`` runs the chosen methods on the same prompts in one
process (models load once; one short warm-up per method is excluded from timing; methods
interleave per prompt so machine drift hits all alike) and appends one JSON line per prompt and
method to ``DIR/results.jsonl``. ``DIR/summary.json``, the printed table and ``DIR/*.png`` are
derived from that file alone, so ``loosespec report DIR`` redraws them at any time.

Methods (``<method>-<drafter>``): ``ar``; ``exact-``, ``rejection-`` and ``fly-`` with ``ngram``,
``model`` or ``mla``; ``specguard`` (draft-assisted, exact), ``specguard-regenerate`` and
``specguard-fly``; the peers ``hf-ar`` (``generate()``), ``hf-pld``
(``generate(prompt_lookup_num_tokens=10)``) and ``hf-assist`` (``generate(assistant_model=draft)``,
transformers' defaults, in the same precision as loosespec's methods); ``llamacpp-ar`` and
``llamacpp-pld`` (llama.cpp on the target's GGUF file, :mod:`loosespec.eval.peers.llamacpp`); ``vllm-ar``, ``vllm-ngram``, ``vllm-draft``, ``vllm-fly`` and
``vllm-fly-ngram`` served by vLLM with the loosespec plugin (:mod:`loosespec.eval.peers.vllm`; one
``vllm serve`` per method, its prompts in a block, measured against ``vllm-ar``). ``fly-*``,
``vllm-fly*`` and ``specguard*`` are LOSSY and marked so in every result.

Resuming: every finished (question, method) pair is a flushed line; a rerun with the same command
skips those. ``DIR/config.json`` holds what the numbers depend on (models, dtype, device, dataset and its
options, token budget, sampling, seed, SpecGuard's tau); running a different configuration into the same DIR
is an error. The prompt limit and the method list may grow between runs: only the missing pairs run.

One run writes a folder at a time: ``bench`` takes an exclusive lock (``fcntl.flock`` on ``DIR/results.lock``,
without waiting; :class:`RunLock`, :func:`open_run`) for the whole run and writes its pid into that file. A
second ``bench --out DIR`` while the first runs fails at once with one line naming DIR and the holder's pid. The
summary counts a repeated (question, method) pair once (a row with a verdict before one whose scoring failed,
else the first written), warns how many were repeated and records the count (``repeated_pairs``), so n,
accuracy and McNemar never count a pair twice.

Reading never changes the folder: a torn last line (a run killed mid-write, or a line a running writer is still
finishing) is skipped with a warning by every reader (``loosespec report``, :mod:`loosespec.eval.failures`).
Only the run holding the lock repairs one: it moves the torn line to ``results.jsonl.corrupt`` and truncates
it off, and that (question, method) pair runs again. A damaged line elsewhere is an error. ``report`` writes
``summary.json`` and the plots only when no run holds the folder (else it prints the table and leaves them to
that run). Every file that is replaced (``config.json``, ``summary.json``, the plots, the Spec-Bench export)
is written whole through a temporary file and a rename (:func:`loosespec.fileio.atomic_write_text`); a
``config.json`` that is not JSON is a one-line error naming it.

Scoring failures are not wrong answers. Every row stores the scorer's verdict
(:class:`loosespec.eval.datasets.Verdict`): ``score`` (True, False, or None for no answer), ``score_status``
(``right``, ``wrong``, ``error``, ``unscored``) and ``score_detail`` (e.g. the sandbox mode, or what
failed). A program under test that fails, times out or runs out of memory is ``wrong``; ``error`` means the
harness failed (a sandbox that could not start, a scorer's own exception): such a row has no answer, is left
out of accuracy, recovery and McNemar, is counted per method (``score_errors``, and a line under the printed
table), and a resumed run scores its stored output again (no generation): the run holding the lock replaces
those rows in place (``results.jsonl`` rewritten whole through a temporary file and a rename, every other line
byte for byte; the earlier verdicts kept in the row's ``score_history``). Rows written before ``score_status``
existed read as right/wrong/unscored from ``score``.

Provenance: ``config.json``'s ``runs`` lists every run on the folder, resumes included (a refused one adds
nothing; :func:`run_provenance`:
``id``, the command line, the UTC date, the loosespec version, the git commit and whether ``loosespec/`` had
uncommitted changes when it runs from a git checkout (else null), the models' sha256 or Hub revision where
known and the evaluation files' sha256); each row names its run (``run_id``). ``runs`` is not part of the
configuration a resumed run must match.

Summary metrics, per method over the prompts it shares with its baseline (``ar``; ``vllm-ar`` for the
``vllm-*`` methods when it ran, named in the summary's ``baseline``); "``ar``" below means that baseline:

- ``speedup`` = total ``ar`` wall time / total method wall time, with a 95% bootstrap interval
  over prompts (``speedup_ci95``), over the prompts where both rows ran on the same machine (every row
  records its ``hardware``; ``timed_prompts`` counts them when some did not; a directory timed on several
  machines also gets ``machines``: rows, speedup and tok/s per machine);
- ``tokens_per_s`` = new tokens / wall time (over the same prompts);
- ``mean_accepted_length`` = emitted tokens / rounds over all rounds (Spec-Bench's and vLLM's tau;
  1 for ``ar``; for the peers from the chunks ``generate`` streams per step);
- ``acceptance_rate`` = accepted draft tokens / drafted tokens (loosespec methods);
- ``accuracy`` (scored datasets; over the pairs where both rows have a verdict: rows whose scoring failed are
  left out and counted in ``score_errors``) with a 95% Wilson interval, ``recovery`` = accuracy / ``ar``
  accuracy, the paired counts ``ar_right_method_wrong`` and ``ar_wrong_method_right`` and McNemar's exact
  p-value on them (``mcnemar_p``: two-sided binomial test of the discordant pairs, 1 when there are none);
- ``identical_to_ar`` = share of outputs whose token ids equal ``ar``'s;
- what actually ran, for the methods with a cost-aware drafter: ``draft_levels``, the share of rounds
  that drafted with the n-gram lookup alone, with the draft model, or not at all (``rounds_explore``:
  rounds a loose rule explored a long draft); for FLy, ``fly_deferrable_rounds`` (rounds whose draft was
  long enough to defer anywhere), ``fly_deferred``, the official counters ``fly_initial_mismatches`` and
  ``fly_window_rescues``, and ``fly_window_meaning`` (what ``fly_window_size`` counted: ``subsequent``
  positions, or ``counting the mismatch`` in rows written before 2026-12-04).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import io
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
import uuid
import warnings
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loosespec.config import DRAFTERS, DecodeConfig, knob_default
from loosespec.errors import LoosespecError
from loosespec.eval.datasets import VERDICT_STATUSES, ScoringError, Verdict, as_verdict
from loosespec.fileio import atomic_write_bytes, atomic_write_text
from loosespec.methods import FLY_GUARD_COUNTERS, FLY_OFFICIAL_COUNTERS, FLY_ROUND_COUNTERS, FLY_WINDOW_MEANING

try:
    import fcntl
except ImportError:  # Windows: msvcrt's byte-range lock instead
    fcntl = None

RESULTS = "results.jsonl"
SUMMARY = "summary.json"
CONFIG = "config.json"
LOCK = "results.lock"  # the run's lock (RunLock): holds the holder's pid while a run writes the folder
RUNS = "runs"  # config.json's provenance of every run on the folder (run_provenance): not compared on resume
GIT_TIMEOUT_S = 5.0

HF_GENERATION_KWARGS = {"hf-ar": {}, "hf-pld": {"prompt_lookup_num_tokens": 10}, "hf-assist": {}}
SPECGUARD_PRESETS = {"specguard": {}, "specguard-regenerate": {"sg_on_reject": "regenerate"},
                     "specguard-fly": {"sg_verify": "fly"}}
STEP_PRESETS = {"specguard": SPECGUARD_PRESETS}  # a step-level method's bench names and their settings
WARMUP_TOKENS = 32  # 8 left transformers' assisted generation paying its one-off set-up in the first timed run
WARMUP_PROMPT_TOKENS = 64  # the warm-up's prompt: the first prompt's start (a long prefill would only cost time)


@dataclass(frozen=True)
class BenchMethod:
    """One name ``loosespec bench --methods`` takes: a loosespec method with its drafter (or a SpecGuard
    preset), or a peer. Lossiness comes from the method registry (loosespec.methods), never from the name."""

    name: str
    kind: str  # "loosespec" | "hf" | "llamacpp" | "vllm"
    lossy: bool
    needs_draft: bool  # loosespec's engine must load the draft model for it
    method: str | None = None  # the loosespec method
    drafter: str | None = None
    overrides: dict = field(default_factory=dict)  # DecodeConfig keywords of a preset


_BENCH_METHODS: dict[str, BenchMethod] = {}


def bench_methods() -> dict[str, BenchMethod]:
    """Every bench method name: the registry's token-level methods x drafters, SpecGuard's presets, the peers."""
    if not _BENCH_METHODS:
        from loosespec.methods import METHODS
        from loosespec.eval.peers.llamacpp import LLAMACPP_METHODS, SERVER_METHODS
        from loosespec.eval.peers.vllm import VLLM_METHODS

        out = {"ar": BenchMethod("ar", "loosespec", METHODS["ar"].lossy, False, "ar")}
        for m in METHODS.values():
            if m.name != "ar" and not m.step_level:
                for d in DRAFTERS:
                    out[f"{m.name}-{d}"] = BenchMethod(f"{m.name}-{d}", "loosespec", m.lossy, d in ("model", "mla"),
                                                       m.name, d)
            elif m.step_level:
                for name, overrides in STEP_PRESETS[m.name].items():
                    out[name] = BenchMethod(name, "loosespec", m.lossy, True, m.name, None, overrides)
        for name in HF_GENERATION_KWARGS:
            out[name] = BenchMethod(name, "hf", False, name == "hf-assist")
        for name in LLAMACPP_METHODS:
            out[name] = BenchMethod(name, "llamacpp", False, False)
        for name in SERVER_METHODS:  # llama.cpp's own speculative decoding with the draft's GGUF
            out[name] = BenchMethod(name, "llamacpp", False, True)
        for name in VLLM_METHODS:  # vLLM's FLy runs loosespec's rule in vLLM: FLy's lossiness
            out[name] = BenchMethod(name, "vllm", METHODS["fly"].lossy if name.startswith("vllm-fly") else False,
                                    False)
        _BENCH_METHODS.update(out)
    return _BENCH_METHODS


def all_method_names() -> list[str]:
    return list(bench_methods())


VARIANT_SEP = "@"
# what a variant may not change: the run's settings (the same for every method, so that speedup and accuracy
# compare like with like) and what the base name already says
NOT_PER_VARIANT = ("method", "drafter", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop")


def bench_method(name: str) -> BenchMethod:
    """A bench method by name: a registered one, or a variant of a loosespec one with knobs set,
    ``<method>@<knob>=<value>[@<knob>=<value>...]`` (e.g. ``fly-ngram@num_draft_tokens=5``,
    ``fly-mla@fly_entropy_threshold=0.6``): the knobs are the decoding configuration's own names,
    validated by its schema. Lossiness is the base method's."""
    from loosespec.config import KNOBS, ConfigError, validate_knob

    known = bench_methods()
    if name in known:
        return known[name]
    base, *parts = name.split(VARIANT_SEP)
    spec = known.get(base)
    if spec is None or not parts:
        raise LoosespecError(f"unknown method '{name}'; choose from: {', '.join(known)} "
                             f"(or a variant, e.g. fly-ngram{VARIANT_SEP}num_draft_tokens=5)")
    if spec.kind != "loosespec":
        raise LoosespecError(f"'{name}': only loosespec's own methods take knob variants, not the peer '{base}'")
    overrides = dict(spec.overrides)
    for part in parts:
        knob, eq, value = part.partition("=")
        if not eq or knob not in KNOBS or knob in NOT_PER_VARIANT:
            allowed = ", ".join(k for k in KNOBS if k not in NOT_PER_VARIANT)
            raise LoosespecError(f"'{name}': '{part}' is not <knob>=<value> with a per-method knob ({allowed})")
        try:
            overrides[knob] = validate_knob(knob, value)
        except ConfigError as e:
            raise LoosespecError(f"'{name}': {e.render('field')}") from None
    return BenchMethod(name, spec.kind, spec.lossy, spec.needs_draft, spec.method, spec.drafter, overrides)


def variant_knobs(name: str) -> dict[str, str]:
    """``fly-ngram@num_draft_tokens=5`` -> {"num_draft_tokens": "5"} (as written; {} for a plain name)."""
    return dict(p.partition("=")[::2] for p in name.split(VARIANT_SEP)[1:])


def base_name(name: str) -> str:
    return name.split(VARIANT_SEP)[0]


def sweep_methods(methods: Sequence[str], knob: str, values: Sequence[str]) -> list[str]:
    """``--sweep knob=v1,v2``: each loosespec method but ``ar`` becomes one variant per value (peers stay)."""
    out = []
    for m in methods:
        if m == "ar" or bench_method(m).kind != "loosespec":
            out.append(m)
        else:
            out += [f"{m}{VARIANT_SEP}{knob}={v}" for v in values]
    return out


def parse_methods(spec: str | Sequence[str]) -> list[str]:
    """``"ar,exact-ngram,..."`` -> validated list with ``ar`` first (the speedup baseline)."""
    items = [m.strip() for m in (spec.split(",") if isinstance(spec, str) else spec) if m.strip()]
    for m in items:
        bench_method(m)  # raises, naming the method and what is wrong with it
    if len(set(items)) != len(items):
        raise LoosespecError(f"a method is listed twice in '{','.join(items)}'")
    return ["ar"] + [m for m in items if m != "ar"]


def needs_draft_model(method: str) -> bool:
    return bench_method(method).needs_draft


def is_lossy(method: str) -> bool:
    return bench_method(method).lossy


def baseline_of(method: str, methods: Sequence[str]) -> str:
    """The method a method's speedup and accuracy retention are measured against: ``vllm-ar`` for the
    ``vllm-*`` methods when it ran (same server software), ``ar`` otherwise."""
    from loosespec.eval.peers.vllm import VLLM_BASELINE, is_vllm_method

    return VLLM_BASELINE if is_vllm_method(method) and VLLM_BASELINE in methods else "ar"


def method_config(method: str, *, max_new_tokens: int, temperature: float, seed: int, has_draft: bool,
                  sg_tau: float | None = None, top_p: float = knob_default("top_p"),
                  top_k: int = knob_default("top_k"),
                  adaptive_draft_length: bool = knob_default("adaptive_draft_length")) -> DecodeConfig | None:
    """The DecodeConfig of a loosespec method (None for the transformers, llama.cpp and vLLM peers)."""
    spec = bench_method(method)
    if spec.kind != "loosespec":
        return None
    common = dict(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, top_p=top_p, top_k=top_k,
                  has_draft_model=has_draft, adaptive_draft_length=adaptive_draft_length)
    tau = {} if sg_tau is None or spec.method != "specguard" else {"sg_tau": sg_tau}
    return DecodeConfig.create(spec.method, spec.drafter, **{**common, **tau, **spec.overrides})  # a variant's knobs win


# ---------------------------------------------------------------------------------------------
# results.jsonl: the run's lock, append, flush, read without changing, repair, resume
# ---------------------------------------------------------------------------------------------


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
            raise LoosespecError(f"{self.out} is being written by another run ({lock_holder(self.out)}); two runs "
                                 f"on one folder would append the same pairs twice: wait for it, or use another --out")
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


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


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
            is_last = all(not x.strip() for x in lines[i + 1:])
            if raw.strip():
                try:
                    row = json.loads(raw)
                    if not isinstance(row, dict):
                        raise ValueError("not a JSON object")
                    if i == len(lines) - 1:  # no trailing newline: the write did not finish
                        raise ValueError("unterminated line")
                except ValueError as e:
                    if not is_last:
                        raise LoosespecError(f"{self.path}: line {i + 1} is damaged ({e}) and is not the last line; "
                                             f"repair or remove it before resuming") from None
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
            warnings.warn(f"{self.path}: skipped a torn last line {line_no} ({why}); a run may still be writing it. "
                          f"Nothing was changed (the next `loosespec bench` on this folder repairs it)", stacklevel=2)
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
        warnings.warn(f"{self.path}: dropped a torn last line {line_no} ({why}); it was saved to {corrupt} "
                      f"and its (question, method) pair will run again", stacklevel=3)

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
        warnings.warn(f"{where}: {repeated} repeated (question, method) pair row(s) (two runs appended to one "
                      f"folder?): each pair is counted once", stacklevel=2)
    return out, repeated


# keys that directories written before they existed lack, and the value those runs had: a directory whose FLy rows
# counted the mismatch in fly_window_size cannot be resumed with today's meaning (rows of both would mix)
LEGACY_WINDOW_MEANING = "counting the mismatch"
LEGACY_CONFIG = {"adaptive_draft_length": False, "fly_window_meaning": LEGACY_WINDOW_MEANING}
DRAFT_LEVELS = ("lookup", "model", "none")  # loosespec.decode.draftlen's rounds_<level> counters
PROVENANCE_KEYS = (RUNS,)  # in config.json, not compared on resume


def read_config(out: Path) -> dict:
    """``DIR/config.json``; one line naming the file when it is not a JSON object (torn, hand-edited)."""
    path = Path(out) / CONFIG
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise LoosespecError(f"{path} is damaged ({e.msg} at line {e.lineno} column {e.colno}): restore it from a "
                             f"copy (it names the settings {path.parent}'s results ran with) or use another "
                             f"--out") from None
    except UnicodeDecodeError as e:
        raise LoosespecError(f"{path} is damaged (not UTF-8 text: {e.reason}): restore it from a copy or use "
                             f"another --out") from None
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
            old = {**{k: v for k, v in LEGACY_CONFIG.items() if k in config},
                   **{k: v for k, v in stored.items() if k not in PROVENANCE_KEYS}}
            if "draft_dtype" in config and "draft_dtype" not in old:  # written before the draft had its own precision
                old["draft_dtype"] = old.get("dtype") if old.get("draft") else None
            diff = sorted(k for k in set(old) | set(config) if old.get(k) != config.get(k))
            if diff:
                lines = "; ".join(f"{k}: {old.get(k)!r} there, {config.get(k)!r} now" for k in diff)
                raise LoosespecError(f"{out} holds results of a different configuration ({lines}); "
                                     f"use another --out directory, or rerun with the same settings")
            if provenance is not None:
                runs = stored.get(RUNS) if isinstance(stored.get(RUNS), list) else []
                atomic_write_text(path, _dump_config({**stored, RUNS: runs + [provenance]}))
            return
        atomic_write_text(path, _dump_config({**config, **({RUNS: [provenance]} if provenance is not None else {})}))


def open_run(out: Path, config: dict, *, data_dir: str | Path | None = None,
             command: str = "loosespec bench", sandbox: str | None = None) -> RunLock:
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


# ---------------------------------------------------------------------------------------------
# provenance
# ---------------------------------------------------------------------------------------------

# the files each evaluation set's loader reads (loosespec.eval.datasets), hashed into every run's provenance
DATASET_FILES: dict[str, tuple[str, ...]] = {
    "gsm8k": ("gsm8k_test.jsonl",), "gsm8k-train": ("gsm8k_train.jsonl",), "mgsm": ("mgsm.jsonl",),
    "math500": ("math500_test.jsonl",), "humaneval": ("humaneval.jsonl",), "mbpp-train": ("mbpp.jsonl",),
    "specbench": ("spec_bench_question.jsonl",), "mtbench": ("mt_bench_question.jsonl",),
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
        r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
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
        from loosespec import models as M

        if spec in M.EMBEDDED:
            e = M.EMBEDDED[spec]
            marker = M._hf_dir(spec) / M._READY_MARKER
            return {"spec": spec, "kind": "embedded", "revision": e.sha256, "gguf_sha256": e.sha256,
                    "original_id": e.original_id,
                    "converted": json.loads(marker.read_text(encoding="utf-8")) if marker.is_file() else None}
        p = Path(spec).expanduser()
        if spec.endswith(".gguf") and p.is_file():
            sha = file_sha256(p)
            return {"spec": spec, "kind": "gguf", "path": str(p.resolve()), "revision": sha, "gguf_sha256": sha}
        if p.is_dir():
            files = {f.name: file_sha256(f) for f in sorted(p.iterdir()) if f.is_file() and not f.name.startswith(".")}
            return {"spec": spec, "kind": "local", "path": str(p.resolve()), "revision": "local", "files": files}
        return {"spec": spec, "kind": "hub", "revision": revision or _hub_revision(spec),
                "requested_revision": revision}
    except Exception as e:  # provenance never stops a run
        return {"spec": spec, "error": f"{type(e).__name__}: {e}"}


def data_provenance(dataset: str, data_dir: str | Path | None = None) -> dict:
    """The files the dataset's loader reads (:data:`DATASET_FILES`), each with where it was read from and its
    sha256 (a Hub copy: its source, revision unknown); an unknown set records nothing. Never raises."""
    from loosespec.eval import datasets as D

    out = {}
    for name in DATASET_FILES.get(dataset, ()):
        try:
            where = D.data_file(name, data_dir)
            if where == D.HUB:
                repo, config, split = D.HUB_SOURCES[name]
                out[name] = {"hub": repo, "config": config, "split": split, "revision": None}
            else:
                out[name] = {"path": str(Path(where).resolve()), "sha256": file_sha256(Path(where))}
        except Exception as e:  # a file that is not there is the loader's error to report, not provenance's
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    return out


def run_provenance(config: dict, *, data_dir: str | Path | None = None, argv: Sequence[str] | None = None,
                   sandbox: str | None = None) -> dict:
    """One run's entry in config.json's ``runs``: ``id`` (each row's ``run_id``), ``argv`` (``sys.argv``),
    ``date`` (UTC, ISO 8601), ``loosespec`` (the version), ``git_commit`` / ``git_dirty``
    (:func:`source_checkout`), ``models`` (``target`` and ``draft``, :func:`model_provenance`; a Hub id's revision
    asked for is the config's ``target_revision`` / ``draft_revision`` where it has one) and
    ``data_files`` (:func:`data_provenance`), and ``sandbox``, the mode model-written code ran in (a set that runs
    none: absent). Nothing here is compared on resume."""
    from loosespec import __version__

    return {"id": uuid.uuid4().hex[:12], "argv": list(sys.argv if argv is None else argv), "date": _utc_now(),
            "loosespec": __version__, **source_checkout(),
            "models": {role: model_provenance(config.get(role), config.get(f"{role}_revision"))
                       for role in ("target", "draft")},
            "data_files": data_provenance(config.get("dataset", ""), data_dir),
            **({} if sandbox is None else {"sandbox": sandbox})}


# ---------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------


class _RoundCounter:
    """A transformers streamer that records how many tokens each ``generate`` step emits."""

    def __init__(self):
        self.lengths: list[int] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:  # generate() first streams the prompt
            self._prompt_seen = True
            return
        self.lengths.append(int(value.numel()))

    def end(self) -> None:
        pass


@dataclass
class Outcome:
    text: str
    token_ids: list[int]
    wall_s: float
    round_lengths: list[int]
    stats: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)


def hf_generate(engine, method: str, ids, *, max_new_tokens: int, temperature: float, seed: int,
                top_p: float = knob_default("top_p"), top_k: int = knob_default("top_k")) -> Outcome:
    """transformers' own ``generate`` on the same loaded model(s) and prompt ids."""
    import torch
    from transformers import GenerationConfig

    from loosespec.decode.engine import sync

    eos = sorted(engine.stop_ids)
    sample = temperature > 0
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=sample, eos_token_id=eos,
                  pad_token_id=engine.tokenizer.pad_token_id if engine.tokenizer.pad_token_id is not None else eos[0],
                  **HF_GENERATION_KWARGS[method])
    if sample:
        kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k or None)
    else:  # the checkpoints' sampling defaults would only produce warnings under greedy decoding
        kwargs.update(temperature=None, top_p=None, top_k=None)
    gc = GenerationConfig(**kwargs)
    extra = {"assistant_model": engine.draft.model, "tokenizer": engine.tokenizer} if method == "hf-assist" else {}
    if extra and engine.bridge is not None:  # transformers' universal assisted generation
        extra["assistant_tokenizer"] = engine.draft.tokenizer
    counter = _RoundCounter()
    inp = ids.unsqueeze(0).to(engine.device)
    torch.manual_seed(seed)
    sync(engine.device)
    t = time.perf_counter()
    with torch.inference_mode():
        out = engine.target.model.generate(inp, attention_mask=torch.ones_like(inp), generation_config=gc,
                                           streamer=counter, **extra)
    sync(engine.device)
    wall = time.perf_counter() - t
    new = out[0, inp.shape[1]:].tolist()  # batch of one: ends at the first end token, no padding
    text = engine.tokenizer.decode(new, skip_special_tokens=True)
    cfg = {"method": method, "generate_kwargs": {k: v for k, v in kwargs.items() if v is not None and k != "eos_token_id"}}
    return Outcome(text, new, wall, counter.lengths, {"new_tokens": len(new), "rounds": len(counter.lengths)}, cfg)


def loosespec_generate(engine, cfg: DecodeConfig, ids) -> Outcome:
    r = engine.generate(ids, cfg)
    return Outcome(r.text, r.token_ids, r.stats.wall_s, list(r.stats.round_lengths), r.stats.to_dict(), cfg.to_dict())


def llamacpp_generate(engine, method: str, ids, *, max_new_tokens: int, temperature: float) -> Outcome:
    """llama.cpp on the target's GGUF file, greedy, same prompt ids, budget and end tokens."""
    import torch

    from loosespec.eval.peers.llamacpp import SERVER_METHODS, LlamaCppPeer, LlamaServerPeer

    if temperature != 0:
        raise LoosespecError("llamacpp-* methods run greedy only here (--temperature 0)")
    if method in SERVER_METHODS:
        server = getattr(engine, "_llama_server", None)
        if server is None:
            server = engine._llama_server = LlamaServerPeer(engine.target.name, engine.draft.name,
                                                            torch.get_num_threads())
        new, wall, timings = server.generate(ids.tolist(), max_new_tokens, engine.stop_ids)
        text = engine.tokenizer.decode(new, skip_special_tokens=True)
        stats = {"new_tokens": len(new), "drafted_tokens": timings.get("draft_n"),
                 "accepted_tokens": timings.get("draft_n_accepted"), "llamacpp_timings": timings}
        cfg = {"method": method, "server": str(server.binary), "args": server.args, "threads": server.threads}
        return Outcome(text, new, wall, [], stats, cfg)
    peer = getattr(engine, "_llamacpp", None)
    if peer is None:
        peer = engine._llamacpp = LlamaCppPeer(engine.target.name, torch.get_num_threads())
    new, wall = peer.generate(method, ids.tolist(), max_new_tokens, engine.stop_ids)
    text = engine.tokenizer.decode(new, skip_special_tokens=True)
    cfg = {"method": method, "gguf": str(peer.path), "threads": peer.threads}
    return Outcome(text, new, wall, [], {"new_tokens": len(new)}, cfg)


def run_method(engine, method: str, ids, settings: dict) -> Outcome:
    s = settings
    if method.startswith("llamacpp-"):
        return llamacpp_generate(engine, method, ids, max_new_tokens=s["max_new_tokens"], temperature=s["temperature"])
    if method in HF_GENERATION_KWARGS:
        return hf_generate(engine, method, ids, max_new_tokens=s["max_new_tokens"], temperature=s["temperature"],
                           seed=s["seed"], top_p=s["top_p"], top_k=s["top_k"])
    cfg = method_config(method, max_new_tokens=s["max_new_tokens"], temperature=s["temperature"], seed=s["seed"],
                        top_p=s["top_p"], top_k=s["top_k"], has_draft=engine.draft is not None, sg_tau=s["sg_tau"],
                        adaptive_draft_length=s.get("adaptive_draft_length", True))
    return loosespec_generate(engine, cfg, ids)


def result_row(problem, dataset: str, method: str, outcome: Outcome, score: "bool | None | Verdict", model_id: str,
               run_id: str | None = None) -> dict:
    """One results.jsonl line; ``choices`` follows Spec-Bench's answer-file layout. ``score``: the scorer's
    verdict (a :class:`~loosespec.eval.datasets.Verdict`, or a bool / None as plain scorers return),
    stored as ``score``, ``score_status`` and ``score_detail``."""
    verdict = as_verdict(score)
    st = outcome.stats
    rounds = len(outcome.round_lengths) or st.get("rounds", 0)
    new = len(outcome.token_ids)
    return {
        "question_id": problem.id, "category": problem.category, "dataset": dataset, "method": method,
        "lossy": is_lossy(method), "model_id": f"{model_id}/{method}",
        "config": outcome.config, "output": outcome.text, "token_ids": outcome.token_ids, "new_tokens": new,
        "wall_time": round(outcome.wall_s, 4), "rounds": rounds, "accept_lengths": outcome.round_lengths,
        "mean_accepted_length": round(new / rounds, 4) if rounds else None,
        "drafted_tokens": st.get("drafted_tokens"), "accepted_tokens": st.get("accepted_tokens"),
        "stats": st, "score": verdict.score, "score_status": verdict.status, "score_detail": dict(verdict.detail),
        "hardware": hardware(),
        "answer": problem.answer if problem.answer is not None and len(problem.answer) <= 200 else None,
        "choices": [{"index": 0, "turns": [outcome.text], "decoding_steps": [rounds], "new_tokens": [new],
                     "wall_time": [round(outcome.wall_s, 4)], "accept_lengths": outcome.round_lengths}],
        "tstamp": time.time(), "run_id": run_id,
    }


def machine_label(hw: dict | None) -> str:
    """One line naming what a row's timing ran on, e.g. ``Intel(R) Xeon(R) Processor (avx2 avx512f; 2 threads)``
    (``hw`` is a row's ``hardware``; rows written without one read ``unrecorded``). Two rows are timed on the
    same machine when their labels are equal."""
    if not hw:
        return "unrecorded"
    label = f"{hw.get('cpu', '?')} ({' '.join(hw.get('cpu_flags') or []) or 'no flags of note'}; " \
            f"{hw.get('threads', '?')} threads)"
    return label + (f", GPU {hw['gpu']}" if hw.get("gpu") else "")


def hardware() -> dict:
    """What a timing ran on (CPU model and flags of note, GPU), recorded with every result."""
    import torch

    from loosespec.hardware import describe_device

    return describe_device(torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))


SPEC_BENCH_KEYS = ("question_id", "category", "model_id", "choices", "tstamp")


def export_spec_bench(rows: Sequence[dict], dest: Path) -> list[Path]:
    """One ``<method>.jsonl`` per method with Spec-Bench's answer-file fields only (``question_id``,
    ``category``, ``model_id``, ``choices[0]`` with ``turns``, ``new_tokens``, ``wall_time``,
    ``accept_lengths``, ``decoding_steps``), the layout its ``evaluation/speed.py`` reads; pass
    ``ar.jsonl`` as its baseline file."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    by_method: dict[str, list[dict]] = defaultdict(list)
    for r in unique_rows(rows, "the rows exported to Spec-Bench's layout")[0]:
        by_method[r["method"]].append({k: r[k] for k in SPEC_BENCH_KEYS})
    paths = []
    for m, items in by_method.items():
        paths.append(dest / f"{m}.jsonl")
        atomic_write_text(paths[-1], "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in items))
    return paths


def pending_pairs(problems: Sequence, methods: Sequence[str], done: set[tuple[str, str]]) -> list[tuple]:
    """(problem, method) pairs still to run, problem by problem, methods interleaved."""
    return [(p, m) for p in problems for m in methods if (p.id, m) not in done]


def run_bench(engine, problems: Sequence, methods: Sequence[str], out: Path, *, dataset: str, settings: dict,
              encode: Callable, scorer: Callable[[object, str], "bool | None | Verdict"], model_id: str,
              progress: bool = True, log: Callable[[str], None] | None = None, vllm=None) -> list[dict]:
    """Run every missing (problem, method) pair, appending each result as soon as it is scored, under the folder's
    lock (the one this process holds, e.g. :func:`open_run`'s, or one taken here). Rows whose scoring failed are
    scored again first (:func:`rescore_errors`). ``scorer`` returns a Verdict, or a bool / None.
    ``vllm``: :class:`loosespec.eval.peers.vllm.VllmSettings` for the ``vllm-*`` methods."""
    with _writing(out) as lock:
        return _run_bench(engine, problems, methods, out, lock, dataset=dataset, settings=settings, encode=encode,
                          scorer=scorer, model_id=model_id, progress=progress, log=log, vllm=vllm)


def _run_bench(engine, problems: Sequence, methods: Sequence[str], out: Path, lock: RunLock, *, dataset: str,
               settings: dict, encode: Callable, scorer: Callable, model_id: str, progress: bool,
               log: Callable[[str], None] | None, vllm) -> list[dict]:
    from tqdm.auto import tqdm

    from loosespec.eval.peers.vllm import is_vllm_method

    results = ResultsFile(out / RESULTS, run_id=lock.run_id)
    rows = rescore_errors(out, problems, methods, scorer=scorer, log=log)
    done = {(r["question_id"], r["method"]) for r in rows}
    todo = pending_pairs(problems, [m for m in methods if not is_vllm_method(m)], done)
    for m in [m for m in methods if is_vllm_method(m)]:
        _run_vllm_method(m, [p for p in problems if (p.id, m) not in done], out, results, rows, dataset=dataset,
                         settings=settings, encode=encode, scorer=scorer, model_id=model_id, vllm=vllm,
                         progress=progress, log=log)
    if not todo:
        return rows
    warm = list(dict.fromkeys(m for _, m in todo))
    first_ids = encode(todo[0][0])[:WARMUP_PROMPT_TOKENS]
    for m in tqdm(warm, desc="warm-up (not timed)", unit="method", disable=not progress, dynamic_ncols=True):
        # one short untimed run per method: kernel, allocator and generate() set-up
        run_method(engine, m, first_ids, {**settings, "max_new_tokens": min(WARMUP_TOKENS, settings["max_new_tokens"])})
    ids_cache: dict[str, object] = {}
    bar = tqdm(todo, desc=f"bench {dataset}", unit="run", disable=not progress, dynamic_ncols=True)
    for problem, method in bar:
        bar.set_postfix_str(f"{problem.id} {method}")
        if problem.id not in ids_cache:
            ids_cache.clear()
            ids_cache[problem.id] = encode(problem)
        outcome = run_method(engine, method, ids_cache[problem.id], settings)
        _record(problem, method, outcome, results, rows, dataset=dataset, scorer=scorer, model_id=model_id, log=log)
    return rows


def judge_output(scorer: Callable, problem, text: str) -> tuple[Verdict, BaseException | None]:
    """The scorer's verdict on ``text`` as a Verdict, never raising for a failure of the scoring: a
    :class:`~loosespec.eval.datasets.ScoringError` or a scorer's own exception is ``Verdict("error", ...)``
    (no answer, scored again on resume). Any other :class:`LoosespecError` (bad scoring options) is an error verdict
    too and is returned second, for the caller to raise once the row is safe."""
    try:
        return as_verdict(scorer(problem, text)), None
    except ScoringError as e:
        return Verdict("error", {"error": str(e), **e.detail}), None
    except LoosespecError as e:
        return Verdict("error", {"error": str(e)}), e
    except Exception as e:  # a scorer's bug is the harness's failure, not a wrong answer
        return Verdict("error", {"error": f"{type(e).__name__}: {e}"}), None


def _verdict_note(v: Verdict) -> str:
    if v.status == "error":
        return f"  scoring failed ({v.detail.get('error', 'no detail')}): no answer, scored again on resume"
    return "" if v.status == "unscored" else f"  {v.status}"


def _record(problem, method: str, outcome: Outcome, results: "ResultsFile", rows: list[dict], *, dataset: str,
            scorer: Callable, model_id: str, log: Callable[[str], None] | None) -> None:
    """Score one finished run, append its row (flushed) and log it. A scoring failure is stored as such
    (``score_status`` ``error``), never as a wrong answer; bad scoring options are raised after the row is written."""
    verdict, failure = judge_output(scorer, problem, outcome.text)
    row = result_row(problem, dataset, method, outcome, verdict, model_id, run_id=results.run_id)
    results.append(row)
    rows.append(row)
    if log is not None:
        log(f"{problem.id:24} {method:20} {row['new_tokens']:4d} tok {row['wall_time']:8.2f} s"
            + _verdict_note(verdict))
    if failure is not None:
        raise failure


def rescore_errors(out: Path, problems: Sequence, methods: Sequence[str], *, scorer: Callable,
                   log: Callable[[str], None] | None = None) -> list[dict]:
    """Score again, from their stored outputs (no generation), the rows of ``problems`` x ``methods`` whose scoring
    failed (``score_status`` ``error``), once per run, under the folder's lock; replace those rows in
    ``results.jsonl`` (rewritten whole through a temporary file and a rename, every other line as it was), the
    earlier verdicts kept in ``score_history``. Repairs a torn last line first. Returns every row."""
    out = Path(out)
    by_id = {p.id: p for p in problems}
    wanted = set(methods)
    with _writing(out) as lock:
        results = ResultsFile(out / RESULTS)
        rows = results.repair()
        new: dict[int, dict] = {}
        failure = None
        for i, r in enumerate(rows):
            pair = (r["question_id"], r["method"])
            if score_status(r) != "error" or pair in lock.rescored or r["question_id"] not in by_id \
                    or r["method"] not in wanted:
                continue
            lock.rescored.add(pair)
            verdict, failure = judge_output(scorer, by_id[r["question_id"]], r.get("output", ""))
            history = list(r.get("score_history") or []) + [{"status": "error", "detail": r.get("score_detail") or {},
                                                               "tstamp": r.get("scored_at", r.get("tstamp"))}]
            new[i] = {**r, "score": verdict.score, "score_status": verdict.status, "score_detail": dict(verdict.detail),
                      "score_history": history, "scored_at": time.time()}
            if log is not None:
                log(f"{r['question_id']:24} {r['method']:20} scored again from its stored output:"
                    + (_verdict_note(verdict) or "  unscored"))
            if failure is not None:
                break
        if new:
            results.replace(new)
            rows = [new.get(i, r) for i, r in enumerate(rows)]
        if failure is not None:
            raise failure
        return rows


def _run_vllm_method(method: str, problems: Sequence, out: Path, results: "ResultsFile", rows: list[dict], *,
                     dataset: str, settings: dict, encode: Callable, scorer: Callable, model_id: str, vllm,
                     progress: bool, log: Callable[[str], None] | None) -> None:
    """One ``vllm serve`` for ``method``: an untimed warm-up request, then its pending prompts in turn."""
    from tqdm.auto import tqdm

    from loosespec.eval.peers.vllm import VllmServer, size_for_shared_gpu, speculative_tokens, vllm_generate

    if not problems:
        return
    if vllm is None:
        raise LoosespecError(f"method '{method}' needs vLLM settings (the CLI passes them)")
    vllm, sized = size_for_shared_gpu(vllm)  # the engine may hold part of the GPU vLLM is about to claim
    if sized and log is not None:
        log(sized)
    s = settings
    kw = dict(max_new_tokens=s["max_new_tokens"], temperature=s["temperature"], seed=s["seed"], top_p=s["top_p"],
              top_k=s["top_k"])
    server_info = {"dtype": vllm.dtype,
                   "num_speculative_tokens": None if method == "vllm-ar" else speculative_tokens(method, vllm),
                   "fly": method.startswith("vllm-fly"), "concurrency": vllm.concurrency,
                   "gpu_memory_utilization": vllm.gpu_memory_utilization}

    def finish(problem, text, token_ids, wall, stats, request):
        outcome = Outcome(text, token_ids, wall, [], stats,
                          {"method": method, "engine": "vllm", "request": request, "server": server_info})
        _record(problem, method, outcome, results, rows, dataset=dataset, scorer=scorer, model_id=model_id, log=log)

    with VllmServer(method, vllm, out / "vllm.log") as server:
        first = [int(i) for i in encode(problems[0])[:WARMUP_PROMPT_TOKENS]]
        vllm_generate(server.base_url, first, **{**kw, "max_new_tokens": min(WARMUP_TOKENS, s["max_new_tokens"])})
        bar = tqdm(total=len(problems), desc=f"bench {dataset} {method}", unit="run", disable=not progress,
                   dynamic_ncols=True)
        if vllm.concurrency == 1:  # batch of one: each request's own counters
            for problem in problems:
                text, token_ids, wall, delta, request = vllm_generate(server.base_url, [int(i) for i in encode(problem)],
                                                                      **kw)
                drafts = int(delta["drafts"])
                finish(problem, text, token_ids, wall,
                       {"new_tokens": len(token_ids), "rounds": drafts if drafts else len(token_ids),
                        "drafted_tokens": int(delta["draft_tokens"]), "accepted_tokens": int(delta["accepted"]),
                        "wall_s": round(wall, 4), "vllm_counters": delta}, request)
                bar.update()
        else:  # concurrent load: blocks of `concurrency` requests in flight; counters per block
            from concurrent.futures import ThreadPoolExecutor

            from loosespec.eval.peers.vllm import spec_counters

            n = vllm.concurrency
            with ThreadPoolExecutor(n) as pool:
                for b in range(0, len(problems), n):
                    block = problems[b: b + n]
                    before, t = spec_counters(server.base_url), time.perf_counter()
                    futures = [pool.submit(vllm_generate, server.base_url, [int(i) for i in encode(p)],
                                           counters=False, **kw) for p in block]
                    done = [f.result() for f in futures]
                    makespan = time.perf_counter() - t
                    after = spec_counters(server.base_url)
                    delta = {k: after[k] - before[k] for k in after}
                    toks = sum(len(d[1]) for d in done)
                    tau = 1 + delta["accepted"] / delta["drafts"] if delta["drafts"] else 1.0
                    for problem, (text, token_ids, wall, _, request) in zip(block, done):
                        # vLLM's counters cannot be split between requests in flight together: each row's
                        # rounds come from its block's mean accepted length
                        finish(problem, text, token_ids, wall,
                               {"new_tokens": len(token_ids), "rounds": max(1, round(len(token_ids) / tau)),
                                "rounds_from_block": True, "wall_s": round(wall, 4),
                                "block": {"requests": len(block), "makespan_s": round(makespan, 4),
                                          "new_tokens": toks, "vllm_counters": delta}}, request)
                        bar.update()
        bar.close()


# ---------------------------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------------------------


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """95% Wilson score interval of a proportion k/n."""
    if n == 0:
        return None
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return round(max(0.0, mid - half), 4), round(min(1.0, mid + half), 4)


def mcnemar_exact(b: int, c: int) -> float:
    """McNemar's exact test of paired right/wrong outcomes: the two-sided binomial p-value of ``b`` discordant
    pairs one way against ``c`` the other under p = 1/2 (scipy's ``binomtest``); 1.0 without discordant pairs."""
    if b + c == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(b, b + c, 0.5).pvalue)


def bootstrap_ratio(num: Sequence[float], den: Sequence[float], reps: int = 2000,
                    seed: int = 0) -> tuple | None:  # the resampling's seed (not a knob)
    """95% percentile bootstrap interval of sum(num)/sum(den), resampling paired items.

    Seeded, so a function of its arguments: remembered per process (a report summarises each method once
    per table and again per category and retention check; 0.1 s each at n = 100)."""
    return _bootstrap_ratio(tuple(num), tuple(den), reps, seed)


@functools.lru_cache(maxsize=4096)
def _bootstrap_ratio(num: tuple, den: tuple, reps: int, seed: int) -> tuple | None:
    n = len(num)
    if n < 2:
        return None
    rng = random.Random(seed)
    stats = []
    for _ in range(reps):
        idx = [rng.randrange(n) for _ in range(n)]
        d = sum(den[i] for i in idx)
        if d > 0:
            stats.append(sum(num[i] for i in idx) / d)
    stats.sort()
    return round(stats[int(0.025 * (len(stats) - 1))], 3), round(stats[int(0.975 * (len(stats) - 1))], 3)


def pooled_mean_accepted_length(new_tokens: Sequence[int], rounds: Sequence[int]) -> float | None:
    """Spec-Bench's mean accepted length over several generations: all emitted tokens / all rounds (pooled,
    not the mean of per-prompt values). The one definition every report of this project uses."""
    total = sum(rounds)
    return round(sum(new_tokens) / total, 4) if total else None


def _method_summary(mine: list[dict], ar: dict[str, dict]) -> dict:
    paired = [r for r in mine if r["question_id"] in ar]
    # a results directory may grow over sessions on different machines: a method's time is compared with
    # ar's on the same prompt only where both ran on the same machine (``timed_prompts`` says how many did)
    timed = [r for r in paired if machine_label(r.get("hardware")) == machine_label(ar[r["question_id"]].get("hardware"))]
    wall = sum(r["wall_time"] for r in timed)
    ar_wall = sum(ar[r["question_id"]]["wall_time"] for r in timed)
    toks = sum(r["new_tokens"] for r in timed)
    drafted = [r["drafted_tokens"] for r in paired if r.get("drafted_tokens") is not None]
    accepted = [r["accepted_tokens"] for r in paired if r.get("accepted_tokens") is not None]
    s = {
        "prompts": len(paired), "lossy": any(r["lossy"] for r in mine),
        "speedup": round(ar_wall / wall, 4) if wall > 0 else None,
        "speedup_ci95": bootstrap_ratio([ar[r["question_id"]]["wall_time"] for r in timed],
                                        [r["wall_time"] for r in timed]),
        "wall_s": round(wall, 3), "new_tokens": toks,
        "tokens_per_s": round(toks / wall, 4) if wall > 0 else None,
        "mean_accepted_length": pooled_mean_accepted_length([r["new_tokens"] for r in paired],
                                                            [r["rounds"] for r in paired]),
        "acceptance_rate": round(sum(accepted) / sum(drafted), 4) if drafted and sum(drafted) else None,
        "identical_to_ar": round(sum(r["token_ids"] == ar[r["question_id"]]["token_ids"] for r in paired)
                                 / len(paired), 4) if paired else None,
    }
    if len(timed) < len(paired):
        s["timed_prompts"] = len(timed)
    # a verdict on both sides: a row whose scoring failed (score_status "error") is no answer, left out and counted
    answered = ("right", "wrong")
    scored = [(score_status(r) == "right", score_status(ar[r["question_id"]]) == "right") for r in paired
              if score_status(r) in answered and score_status(ar[r["question_id"]]) in answered]
    errors = sum(score_status(r) == "error" for r in mine)
    if errors:
        s["score_errors"] = errors
    if scored:
        right = sum(m for m, _ in scored)
        ar_right = sum(a for _, a in scored)
        acc, ar_acc = right / len(scored), ar_right / len(scored)
        s.update({
            "scored": len(scored), "accuracy": round(acc, 4), "accuracy_ci95": wilson(right, len(scored)),
            "ar_accuracy": round(ar_acc, 4), "recovery": round(acc / ar_acc, 4) if ar_acc else None,
            "ar_right_method_wrong": sum(a and not m for m, a in scored),
            "ar_wrong_method_right": sum(m and not a for m, a in scored),
        })
        s["mcnemar_p"] = mcnemar_exact(s["ar_right_method_wrong"], s["ar_wrong_method_right"])
    blocks = {(b["makespan_s"], b["new_tokens"]): b["vllm_counters"]
              for r in paired if (b := r.get("stats", {}).get("block"))}
    if blocks:  # vLLM under concurrent load: tokens of all requests / time the blocks took
        s["throughput_tokens_per_s"] = round(sum(t for _, t in blocks) / sum(m for m, _ in blocks), 4)
        drafted_in_blocks = sum(c["draft_tokens"] for c in blocks.values())
        if s["acceptance_rate"] is None and drafted_in_blocks:  # rows cannot split the counters; blocks can
            s["acceptance_rate"] = round(sum(c["accepted"] for c in blocks.values()) / drafted_in_blocks, 4)
    steps = [r["stats"].get("steps") for r in paired if r.get("stats", {}).get("steps")]
    if steps:
        s["step_accept_rate"] = round(sum(r["stats"]["accepted_steps"] for r in paired if r["stats"].get("steps"))
                                      / sum(steps), 4)
    # fly_prefix_mismatches was fly_mismatches in rows written before 2026-12-01 (renamed: not the paper's count)
    fly = {"fly_prefix_mismatches": sum(r["stats"].get("fly_prefix_mismatches", r["stats"].get("fly_mismatches", 0))
                                        for r in paired),
           "fly_deferred": sum(r["stats"].get("fly_deferred", 0) for r in paired)}
    for name in FLY_GUARD_COUNTERS:  # only when FLy's copy guard was on (--fly-copy-guard)
        if any(name in r["stats"] for r in paired):
            fly[name] = sum(r["stats"].get(name, 0) for r in paired)
    for name in FLY_OFFICIAL_COUNTERS + FLY_ROUND_COUNTERS:  # rows written before 2026-12-04 lack them
        if any(name in r["stats"] for r in paired):
            fly[name] = sum(r["stats"].get(name, 0) for r in paired)
    if fly["fly_prefix_mismatches"] or any(r.get("config", {}).get("method") == "fly" for r in paired):
        s.update(fly)
        meanings = {r.get("config", {}).get("fly_window_meaning", LEGACY_WINDOW_MEANING) for r in paired}
        s["fly_window_meaning"] = meanings.pop() if len(meanings) == 1 else "mixed"
    s.update(_levels(paired))
    return s


def _levels(rows: list[dict]) -> dict:
    """The share of rounds per draft level (``draft_levels``), and the exploration rounds, over rows with counts."""
    counts = {lv: sum(r.get("stats", {}).get(f"rounds_{lv}", 0) for r in rows) for lv in DRAFT_LEVELS}
    total = sum(counts.values())
    if not total:
        return {}
    out = {"draft_levels": {lv: round(c / total, 4) for lv, c in counts.items()}, "level_rounds": total}
    explore = sum(r.get("stats", {}).get("rounds_explore", 0) for r in rows)
    if explore:
        out["rounds_explore"] = explore
    return out


def summarize(rows: Sequence[dict], methods: Sequence[str] | None = None) -> dict:
    """Per method (``methods``) and per category (``categories``); see the module docstring. A repeated
    (question, method) pair counts once (:func:`unique_rows`, with a warning; ``repeated_pairs``)."""
    rows, repeated = unique_rows(rows)
    methods = list(methods or dict.fromkeys(r["method"] for r in rows))
    present = {r["method"] for r in rows}
    base = {b: {r["question_id"]: r for r in rows if r["method"] == b} for b in ("ar", "vllm-ar")}
    out = {"methods": {}, "categories": {}}
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        if mine:
            b = baseline_of(m, present)
            out["methods"][m] = {**_method_summary(mine, base[b]), **({"baseline": b} if b != "ar" else {})}
    for cat in sorted({r["category"] for r in rows}):
        out["categories"][cat] = {}
        for m in methods:
            mine = [r for r in rows if r["method"] == m and r["category"] == cat]
            if mine:
                b = baseline_of(m, present)
                cat_base = {q: r for q, r in base[b].items() if r["category"] == cat}
                out["categories"][cat][m] = _method_summary(mine, cat_base)
    machines = dict.fromkeys(machine_label(r.get("hardware")) for r in rows)
    if len(machines) > 1:  # speed per machine (accuracy is the whole set's, above)
        out["machines"] = {}
        for label in machines:
            here = [r for r in rows if machine_label(r.get("hardware")) == label]
            on = {"rows": len(here), "methods": {}}
            here_base = {b: {r["question_id"]: r for r in here if r["method"] == b} for b in base}
            for m in methods:
                mine = [r for r in here if r["method"] == m]
                if mine and here_base[baseline_of(m, present)]:
                    ms = _method_summary(mine, here_base[baseline_of(m, present)])
                    on["methods"][m] = {k: ms[k] for k in ("prompts", "speedup", "speedup_ci95", "tokens_per_s")}
            out["machines"][label] = on
    if repeated:
        out["repeated_pairs"] = repeated
    return out


def _fmt(v, spec: str = ".2f", none: str = "-") -> str:
    return none if v is None else format(v, spec)


def format_table(summary: dict) -> str:
    # under concurrent load (vLLM, --vllm-concurrency N) tok/s is each request's own rate; the column
    # "throughput tok/s" is what the server delivered: every request's tokens over the time the blocks took
    load = any("throughput_tokens_per_s" in s for s in summary["methods"].values())
    head = ("| method | n | speedup (95% CI) | tok/s |" + (" throughput tok/s |" if load else "")
            + " mean accepted length | acceptance rate | accuracy (95% CI) "
            "| recovery | ar right, method wrong | ar wrong, method right | McNemar p | identical to ar |")
    lines = [head, "| --- |" + " ---: |" * (head.count("|") - 2)]
    for m, s in summary["methods"].items():
        ci = s.get("speedup_ci95")
        speed = _fmt(s["speedup"]) + "x" + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "")
        if "timed_prompts" in s:  # the others ran on another machine than their ar row
            speed += f", {s['timed_prompts']} timed"
        acc = "-"
        if "accuracy" in s:
            a = s["accuracy_ci95"]
            acc = f"{s['accuracy']:.2f} ({a[0]:.2f}-{a[1]:.2f})"
        lines.append(
            f"| {m}{' (lossy)' if s['lossy'] else ''} | {s['prompts']} | {speed} | {_fmt(s['tokens_per_s'])} | "
            + (f"{_fmt(s.get('throughput_tokens_per_s'))} | " if load else "") +
            f"{_fmt(s['mean_accepted_length'])} | {_fmt(s['acceptance_rate'])} | {acc} | {_fmt(s.get('recovery'))} | "
            f"{s.get('ar_right_method_wrong', '-')} | {s.get('ar_wrong_method_right', '-')} | {_fmt(s.get('mcnemar_p'), '.3g')} | "
            f"{_fmt(s['identical_to_ar'])} |")
    return "\n".join(lines)


def format_drafting_table(summary: dict) -> str:
    """What actually ran, per method with a cost-aware drafter or FLy: the share of rounds per draft level, and for
    FLy the rounds long enough to defer, the deferrals and the official accept rate (rescues / initial
    mismatches). Empty when no method has these counts."""
    rows = [(m, s) for m, s in summary["methods"].items() if "draft_levels" in s or "fly_deferred" in s]
    if not rows:
        return ""
    lines = ["| method | rounds | lookup only | draft model | no draft | explored | could defer | deferrals "
             "| official accept rate (rescues / mismatches) | window counts |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for m, s in rows:
        lv = s.get("draft_levels") or {}
        pct = lambda x: "-" if x is None else f"{100 * x:.0f}%"  # noqa: E731
        deferrable = s.get("fly_deferrable_rounds")
        total = s.get("level_rounds")
        rate = "-"
        if s.get("fly_initial_mismatches"):
            rate = f"{s['fly_window_rescues'] / s['fly_initial_mismatches']:.3f} ({s['fly_window_rescues']} / " \
                   f"{s['fly_initial_mismatches']})"
        lines.append(f"| {m}{' (lossy)' if s['lossy'] else ''} | {total if total else '-'} | {pct(lv.get('lookup'))} | "
                     f"{pct(lv.get('model'))} | {pct(lv.get('none'))} | {s.get('rounds_explore', 0) if lv else '-'} | "
                     + (f"{deferrable}" + (f" ({pct(deferrable / total)})" if total else "") if deferrable is not None
                        else "-")
                     + f" | {s.get('fly_deferred', '-')} | {rate} | {s.get('fly_window_meaning', '-')} |")
    return "\n".join(lines)


def format_machine_table(summary: dict) -> str:
    """Where a set was timed on several machines: per machine and method, n, speedup (95% CI) and tok/s."""
    lines = ["| machine | method | n | speedup (95% CI) | tok/s |", "| --- | --- | ---: | ---: | ---: |"]
    for label, on in summary.get("machines", {}).items():
        for m, s in on["methods"].items():
            ci = s.get("speedup_ci95")
            lines.append(f"| {label} | {m} | {s['prompts']} | {_fmt(s['speedup'])}x"
                         + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "") + f" | {_fmt(s['tokens_per_s'])} |")
    return "\n".join(lines)


def format_category_table(summary: dict) -> str:
    """Per category and method: n, speedup, mean accepted length, accuracy, recovery, identical to ar."""
    lines = ["| category | method | n | speedup | mean accepted length | accuracy | recovery | identical to ar |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for cat, per in summary["categories"].items():
        for m, s in per.items():
            lines.append(f"| {cat} | {m}{' (lossy)' if s['lossy'] else ''} | {s['prompts']} | {_fmt(s['speedup'])}x | "
                         f"{_fmt(s['mean_accepted_length'])} | {_fmt(s.get('accuracy'))} | {_fmt(s.get('recovery'))} | "
                         f"{_fmt(s['identical_to_ar'])} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------


def _save(plt, fig, path: Path) -> Path:
    """The figure written whole (temporary file and rename): a reader never sees half a plot."""
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=120, format=Path(path).suffix.lstrip(".") or "png")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


def plot(rows: Sequence[dict], summary: dict, out: Path) -> list[Path]:
    """speedup_by_category.png, recovery_vs_speedup.png (scored sets), accepted_lengths.png,
    acceptance_by_position.png (pooled over prompts: rounds accepting draft position i / rounds drafting it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    methods = [m for m in summary["methods"] if m != "ar"]
    cats = list(summary["categories"])
    if methods and cats:
        fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cats) * max(1, len(methods)) / 3), 4))
        width = 0.8 / len(methods)
        for i, m in enumerate(methods):
            ys = [summary["categories"][c].get(m, {}).get("speedup") for c in cats]
            xs = [j + i * width for j in range(len(cats))]
            # a method that did not run in a category has no bar (and says so), never a bar of height 0
            ax.bar(xs, [math.nan if y is None else y for y in ys], width,
                   label=m + (" (lossy)" if is_lossy(m) else ""))
            for x, y in zip(xs, ys):
                if y is None:
                    ax.text(x, 0.02, "n/a", rotation=90, ha="center", va="bottom", fontsize=6,
                            transform=ax.get_xaxis_transform())
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cats))], cats, rotation=20, ha="right")
        ax.set_ylabel("speedup over ar (wall time)")
        ax.set_title("Speedup by category")
        ax.legend(fontsize=7)
        paths.append(_save(plt, fig, out / "speedup_by_category.png"))
    scored = [m for m in methods if summary["methods"][m].get("recovery") is not None]
    if scored:
        fig, ax = plt.subplots(figsize=(5.5, 4))
        for m in scored:
            s = summary["methods"][m]
            ax.scatter(s["speedup"], s["recovery"], marker="x" if s["lossy"] else "o")
            ax.annotate(m, (s["speedup"], s["recovery"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.axvline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xlabel("speedup over ar")
        ax.set_ylabel("accuracy recovery (method / ar)")
        ax.set_title("Accuracy recovery vs speedup (x: lossy)")
        paths.append(_save(plt, fig, out / "recovery_vs_speedup.png"))
    lengths = {m: [x for r in rows if r["method"] == m for x in r["accept_lengths"]] for m in summary["methods"]}
    lengths = {m: v for m, v in lengths.items() if v and m != "ar"}
    if lengths:
        top = max(max(v) for v in lengths.values())
        fig, ax = plt.subplots(figsize=(6, 4))
        bins = [x + 0.5 for x in range(0, top + 1)]
        for m, v in lengths.items():
            ax.hist(v, bins=bins, histtype="step", density=True, label=m, lw=1.4)
        ax.set_xlabel("tokens emitted per round (accepted + 1)")
        ax.set_ylabel("share of rounds")
        ax.set_title("Accepted lengths per method")
        ax.legend(fontsize=7)
        paths.append(_save(plt, fig, out / "accepted_lengths.png"))
    paths += _plot_sweeps(plt, summary, out)
    per_pos = acceptance_by_position(rows)
    if per_pos:
        fig, ax = plt.subplots(figsize=(6, 4))
        for m, rates in per_pos.items():
            ax.plot(range(1, len(rates) + 1), rates, marker="o", ms=3, label=m + (" (lossy)" if is_lossy(m) else ""))
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance (rounds accepting it / rounds drafting it)")
        ax.set_ylim(0, 1.02)
        ax.set_title("Acceptance by draft position")
        ax.legend(fontsize=7)
        paths.append(_save(plt, fig, out / "acceptance_by_position.png"))
    return paths


def sweeps(methods: Sequence[str]) -> dict[str, dict[str, list[tuple[float, str]]]]:
    """{knob: {base method: [(value, variant name), ...] sorted by value}} for the knobs that at least two
    variants of one method set (and nothing else): what ``--sweep`` runs."""
    out: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for m in methods:
        knobs = variant_knobs(m)
        if len(knobs) != 1:
            continue
        (knob, value), = knobs.items()
        try:
            x = float(value)
        except ValueError:
            continue  # a categorical knob has no axis
        out[knob][base_name(m)].append((x, m))
    return {k: {b: sorted(v) for b, v in per.items() if len(v) > 1} for k, per in out.items()
            if any(len(v) > 1 for v in per.values())}


def _plot_sweeps(plt, summary: dict, out: Path) -> list[Path]:
    """speedup_by_<knob>.png per swept knob: speedup over ar (95% bootstrap interval as bars where there is one)
    and, on a scored set, accuracy against the knob's value, one line per method; every point is a run."""
    paths = []
    for knob, per_base in sweeps(list(summary["methods"])).items():
        scored = any(summary["methods"][m].get("accuracy") is not None for v in per_base.values() for _, m in v)
        fig, axes = plt.subplots(1, 2 if scored else 1, figsize=(10 if scored else 5.5, 4), squeeze=False)
        for base, points in per_base.items():
            label = base + (" (lossy)" if is_lossy(base) else "")
            xs = [x for x, _ in points]
            s = [summary["methods"][m] for _, m in points]
            ys = [r.get("speedup") for r in s]
            ci = [r.get("speedup_ci95") or (y, y) for r, y in zip(s, ys)]
            err = [[y - lo if y is not None and lo is not None else 0 for y, (lo, _) in zip(ys, ci)],
                   [hi - y if y is not None and hi is not None else 0 for y, (_, hi) in zip(ys, ci)]]
            axes[0][0].errorbar(xs, [math.nan if y is None else y for y in ys], yerr=err, marker="o", ms=4,
                                capsize=3, label=label)
            if scored:
                axes[0][1].plot(xs, [math.nan if r.get("accuracy") is None else r["accuracy"] for r in s],
                                marker="o", ms=4, label=label)
        axes[0][0].axhline(1.0, color="black", lw=0.8, ls="--")
        axes[0][0].set_xlabel(knob)
        axes[0][0].set_ylabel("speedup over ar (wall time)")
        axes[0][0].set_title(f"Speedup against {knob}")
        axes[0][0].legend(fontsize=7)
        if scored:
            ar_acc = next((summary["methods"][m].get("ar_accuracy") for v in per_base.values() for _, m in v
                           if summary["methods"][m].get("ar_accuracy") is not None), None)
            if ar_acc is not None:
                axes[0][1].axhline(ar_acc, color="black", lw=0.8, ls="--", label="ar")
            axes[0][1].set_xlabel(knob)
            axes[0][1].set_ylabel("accuracy")
            axes[0][1].set_title(f"Accuracy against {knob}")
            axes[0][1].legend(fontsize=7)
        paths.append(_save(plt, fig, out / f"speedup_by_{knob}.png"))
    return paths


def acceptance_by_position(rows: Sequence[dict]) -> dict[str, list[float]]:
    """Per method, pooled over its rows: accepted / drafted at each draft position (rows with the counts)."""
    drafted: dict[str, list[int]] = defaultdict(list)
    accepted: dict[str, list[int]] = defaultdict(list)
    for r in rows:
        st = r.get("stats") or {}
        d, a = st.get("num_drafted_per_pos"), st.get("num_accepted_tokens_per_pos")
        if not d or a is None:
            continue
        for counts, new in ((drafted[r["method"]], d), (accepted[r["method"]], a)):
            counts.extend([0] * (len(new) - len(counts)))
            for i, x in enumerate(new):
                counts[i] += x
    return {m: [a / d for a, d in zip(accepted[m] + [0] * (len(drafted[m]) - len(accepted[m])), drafted[m]) if d]
            for m in drafted if any(drafted[m])}


def summary_notes(summary: dict) -> list[str]:
    """Lines under the printed table for what the numbers leave out: rows whose scoring failed (per method) and
    repeated (question, method) pairs."""
    notes = []
    errors = {m: s["score_errors"] for m, s in summary["methods"].items() if s.get("score_errors")}
    if errors:
        notes.append(f"Scoring failed for {sum(errors.values())} row(s) ("
                     + ", ".join(f"{m} {n}" for m, n in errors.items()) + "): no answer, left out of accuracy, "
                     "recovery and McNemar; a resumed `loosespec bench` scores them again.")
    if summary.get("repeated_pairs"):
        notes.append(f"results.jsonl repeats {summary['repeated_pairs']} (question, method) pair row(s) (two runs "
                     "appended to one folder?): each pair is counted once.")
    return notes


def report(out: Path, methods: Sequence[str] | None = None, config: dict | None = None,
           draw: bool = True, write: bool = True) -> tuple[dict, str]:
    """(Re)build ``summary.json`` (unless not ``write``), the table and the plots from ``DIR/results.jsonl``.

    Reading changes nothing (a torn last line is skipped, :meth:`ResultsFile.read`); ``summary.json`` and the
    plots are replaced whole, and only when no other run holds the folder's lock (else a warning says who does and
    they are left to that run)."""
    out = Path(out)
    if not (out / RESULTS).exists():
        raise LoosespecError(f"no {RESULTS} in {out}: run `loosespec bench --out {out}` first")
    rows = ResultsFile(out / RESULTS).read()
    if not rows:
        raise LoosespecError(f"{out / RESULTS} holds no results yet")
    if config is None and (out / CONFIG).exists():
        config = read_config(out)
    summary = summarize(rows, methods)
    if "ar" not in summary["methods"]:
        raise LoosespecError(f"{out} has no ar results: speedup and recovery are measured against ar")
    summary["config"] = config or {}
    summary["rows"] = len(rows)
    text = format_table(summary)
    notes = summary_notes(summary)
    if notes:
        text += "\n\n" + "\n".join(notes)
    drafting = format_drafting_table(summary)
    if drafting:
        text += "\n\nWhat ran (share of rounds by draft level; FLy: rounds long enough to defer, deferrals):\n\n" + drafting
    if len(summary["categories"]) > 1:
        text += "\n\nBy category:\n\n" + format_category_table(summary)
    if summary.get("machines"):
        text += ("\n\nTimed on several machines; speedup pairs each row with ar's on the same prompt and machine. "
                 "By machine:\n\n" + format_machine_table(summary))
    if write or draw:
        with _derived_writes(out) as holder:
            if holder is not None:
                warnings.warn(f"{out} is being written by another run ({holder}): summary.json and the plots are "
                              f"left to it", stacklevel=2)
            else:
                if write:
                    atomic_write_text(out / SUMMARY, json.dumps(summary, indent=1) + "\n")
                if draw:
                    plot(unique_rows(rows, warn=False)[0], summary, out)
    return summary, text


def run_config(*, target: str, draft: str | None, dtype: str, device: str, dataset: str, options: dict,
               max_new_tokens: int, temperature: float, top_p: float, top_k: int, seed: int,
               sg_tau: float | None, scorer: str,
               adaptive_draft_length: bool = knob_default("adaptive_draft_length"),
               draft_dtype: str | None = None) -> dict:
    """What the numbers in a results directory depend on (compared on every resume). ``draft_dtype``: the draft's
    precision (None: the target's, or no draft)."""
    import torch
    import transformers

    from loosespec import __version__

    return {"target": target, "draft": draft, "dtype": dtype, "device": device, "dataset": dataset,
            "draft_dtype": None if draft is None else draft_dtype or dtype,
            "dataset_options": options, "max_new_tokens": max_new_tokens, "temperature": temperature,
            "top_p": top_p, "top_k": top_k, "seed": seed, "sg_tau": sg_tau, "scorer": scorer,
            "adaptive_draft_length": adaptive_draft_length, "fly_window_meaning": FLY_WINDOW_MEANING,
            "loosespec": __version__, "torch": torch.__version__.split("+")[0],
            "transformers": transformers.__version__, "machine": platform.machine()}
