"""Run untrusted Python (model-generated HumanEval completions) in a throw-away, limited subprocess.

Two entry points, each starting fresh ``python -I -B`` processes, never raising for anything the code does:

* :func:`run_tests`, how loosespec scores model-written code: the program (prompt + completion, no tests)
  runs in the sandbox and only answers calls to its entry point; the problem's trusted prompt and tests run
  in a second process, the driver (:mod:`loosespec.eval.sandbox_driver`), with the entry point bound to a
  proxy that calls the program over two pipes and reads back plain data only
  (:mod:`loosespec.eval.sandbox_wire`). The verdict is the driver's: the program cannot reach it by its exit
  status, a printed marker, patched builtins or an ``__eq__`` that always says yes.
* :func:`run_python`: run a program; **exit status 0 means passed**, which the program itself can claim
  (``os._exit(0)``), so it is for programs that are not being judged.

Which sandbox: ``mode`` (or ``$LOOSESPEC_SANDBOX``), see :func:`loosespec.eval.sandbox_probe.resolve_mode`:
``"auto"`` takes the best this machine gives and refuses ``"none"``, which must be asked for by name. Every
result says its mode.

What every call does
--------------------
* Fresh process, isolated interpreter (``sys.executable -I -B``: no user site, no ``PYTHON*``
  environment variables, no bytecode written). Minimal environment (``PATH``, ``LANG``; ``HOME`` and
  ``TMPDIR`` point at the sandbox directory).
* The code is written to ``program.py`` in a new :class:`tempfile.TemporaryDirectory`, which is also
  the working directory. The directory is always removed afterwards, after first restoring write
  and search permission on everything in it, so ``chmod`` games inside it do not leave it behind.
* Its own session and process group (``start_new_session=True``). On the wall-clock timeout the
  whole process group is killed with SIGKILL; it is also SIGKILLed after a normal exit, so children
  left running in the group die too.
* Resource limits set in the child before the code runs: ``RLIMIT_AS`` (``memory_mb``),
  ``RLIMIT_CPU`` (``int(timeout_s) + 2`` s soft, +1 s hard; the wall clock normally ends
  things first), ``RLIMIT_FSIZE`` (``max_file_mb``),
  ``RLIMIT_CORE`` 0, ``RLIMIT_NPROC`` (``max_processes``; see the caveats below).
* stdout / stderr go to anonymous temporary files (never pipes, so a huge output cannot block the
  child or the parent; their size is bounded by ``RLIMIT_FSIZE``). The result keeps the last 2000
  characters of each.
* A Python-level guard installed before the code runs (defence in depth, always on, in the spirit of
  OpenAI human-eval's ``reliability_guard``): ``os.fork``/``forkpty``/``system``/``exec*``/
  ``posix_spawn*``/``kill``/``killpg``/``setsid``/``setpgid``, ``subprocess.Popen`` and
  ``_posixsubprocess.fork_exec`` (so ``multiprocessing`` cannot start workers either),
  ``os.chown``/``chroot``/``fchmod``/``fchown``, ``resource.setrlimit`` and
  ``shutil.chown`` raise ``PermissionError``. File-changing calls (``open``/``os.open`` for
  writing, ``os.remove``/``unlink``/``rmdir``/``rename``/``replace``/``truncate``/``chmod``/
  ``mkdir``/``symlink``/``link``/``utime``, ``shutil.rmtree``/``move``, and so ``pathlib`` too)
  raise ``PermissionError`` unless the path is inside the sandbox directory (``/dev/null`` may be
  opened for writing); so do ``io.FileIO`` and opening another process's ``/proc/PID/`` entries (its
  environment, memory, open files). Unless ``network=True``, ``socket.socket``, ``socket.create_connection``,
  ``getaddrinfo`` and friends raise ``PermissionError``. Importing ``ctypes``, ``cffi``, ``sqlite3``, ``dbm``,
  ``_posixshmem``, the sub-interpreter modules or CPython's ``_test*`` modules raises ``ImportError``.
* Outside ``"full"`` mode, this process is made non-dumpable while the child runs (the driver always is), so
  the kernel refuses another process of the same user its ``/proc/PID/environ``, ``mem`` and ``fd`` and
  ``ptrace`` (root keeps ``CAP_SYS_PTRACE``).
* In ``"none"`` mode without ``network=True``, a seccomp filter installed before the code runs refuses
  ``socket()`` for every family but ``AF_UNIX``, ``io_uring_setup``, ``ptrace``, ``process_vm_readv``/``writev``
  and any syscall of a foreign ABI (x32, i386): a barrier ``ctypes`` does not pass (x86-64 and aarch64).

Namespaces and modes
--------------------
Where user namespaces are available the child runs in its own (``"full"``: user, mount, PID, network, IPC,
UTS, every mount but its directory read-only; ``"net"``: user and network only), else as a plain subprocess
(``"none"``, only when asked for by name). What each mode isolates, and how it is probed:
:mod:`loosespec.eval.sandbox_probe`.

What is NOT protected
---------------------
* In ``"net"`` and ``"none"`` mode the file guard is Python-level only: introspection (a guarded
  function's closure holds the original), removing the import guard from ``sys.meta_path`` and then
  ``ctypes`` bypass it. Use ``"full"`` mode (or a container / VM) for real hostile code. In ``"none"``
  mode run as root, native code can also read other processes' memory and environment through /proc.
* **Reading** is not restricted in any mode: the code can read every file the calling user can
  read (it can only report it on its stdout, since the network is off).
* ``RLIMIT_NPROC`` counts all processes of the real user and is not enforced at all for root (uid
  0, also inside a user namespace that maps to it). Where it is enforced, outside a user namespace
  it is set to (the user's current task count + ``max_processes``). A fork bomb is therefore only
  *bounded* in ``"full"`` mode (per-namespace ``pid_max`` on kernels >= 6.14, or ``RLIMIT_NPROC``
  counted per user namespace for non-root users); elsewhere the Python guard stops ``os.fork`` and
  friends, and the process-group kill ends whatever got through, but a native (``ctypes``) fork
  bomb run as root outside ``"full"`` mode is not bounded until the timeout.
* In ``"net"``/``"none"`` mode a process that leaves the process group (``setsid`` through
  ``ctypes``) survives the kill.
* ``RLIMIT_AS`` limits each process, not their sum; "memory" status is best effort (a
  ``MemoryError`` in stderr, or an unexplained SIGKILL that was not our timeout).
* CPU time of threads adds up, so a multi-threaded program may hit ``RLIMIT_CPU`` (reported as
  "timeout") before the wall clock.
* Disk: ``RLIMIT_FSIZE`` bounds each file, not the number of files written in the sandbox dir.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from loosespec.eval import sandbox_probe as probe

__all__ = ["SandboxResult", "run_python", "run_tests"]

_TAIL_CHARS = 2000
_SETUP_FAILED_RC = 97
_SETUP_FAILED_MARK = "loosespec-sandbox: setup failed"


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one :func:`run_python` call.

    ``status``: "passed" (exit 0), "failed" (non-zero exit / exception), "timeout" (wall-clock or
    CPU limit hit), "memory" (MemoryError or killed for memory, best effort), "error" (the sandbox
    could not start).
    """

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    mode: str = ""  # the sandbox mode it ran in
    detail: str = ""  # run_tests: why the tests failed, or why there is no verdict

    @property
    def passed(self) -> bool:
        return self.status == "passed"


# ------------------------------------------------------------------------------------------ running


def _user_task_count(uid: int) -> int:
    """Tasks (processes + threads) whose real uid is ``uid``: what RLIMIT_NPROC counts."""
    n = 0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/status") as f:
                real_uid = threads = None
                for line in f:
                    if line.startswith("Uid:"):
                        real_uid = int(line.split()[1])
                    elif line.startswith("Threads:"):
                        threads = int(line.split()[1])
            if real_uid == uid:
                n += threads or 1
        except (OSError, ValueError, IndexError):
            continue
    return n


def _tail(f) -> str:
    try:
        f.flush()
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - 4 * _TAIL_CHARS))
        return f.read().decode("utf-8", "replace")[-_TAIL_CHARS:]
    except (OSError, ValueError):
        return ""


def _force_rmtree(path: str) -> None:
    """Remove ``path`` even if the code removed permissions inside it."""
    if not os.path.lexists(path):
        return
    for _ in range(3):
        try:
            os.chmod(path, 0o700)
        except OSError:
            pass
        for root, dirs, _files in os.walk(path):
            for d in dirs:
                p = os.path.join(root, d)
                try:
                    if not os.path.islink(p):
                        os.chmod(p, 0o700)
                except OSError:
                    pass
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return


def _wait(pid: int, deadline: float) -> bool:
    """Wait for ``pid`` to exit, without reaping it (so its process group id stays ours).
    Returns True if the deadline passed first."""
    delay = 0.002
    while True:
        try:
            r = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return False
        except InterruptedError:
            continue
        if r is not None:
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.05)


def _classify(rc: int | None, timed_out: bool, stderr: str) -> str:
    if timed_out:
        return "timeout"
    if rc == 0:
        return "passed"
    if rc == _SETUP_FAILED_RC and _SETUP_FAILED_MARK in stderr:
        return "error"
    if rc is not None and rc < 0 and -rc == getattr(signal, "SIGXCPU", -1):
        return "timeout"
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    if lines and lines[-1].startswith("MemoryError"):
        return "memory"
    if rc is not None and rc < 0 and -rc == signal.SIGKILL:
        return "memory"  # not our kill: most likely the kernel's OOM killer (or the hard CPU limit)
    return "failed"


_dumpable_lock = threading.Lock()
_undumpable_users = 0


@contextlib.contextmanager
def _undumpable(active: bool):
    """While a sandbox child runs without a PID namespace, make this process non-dumpable: the kernel then
    refuses other processes of this user (the child) its /proc/PID/environ, mem, fd and ptrace. Root keeps
    CAP_SYS_PTRACE and is not stopped. Restored when the last concurrent child ends."""
    global _undumpable_users
    prctl = None
    if active and sys.platform.startswith("linux"):
        try:
            import ctypes

            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError, ImportError):
            prctl = None
    if prctl is None:
        yield
        return
    with _dumpable_lock:
        if _undumpable_users == 0:
            _undumpable.saved = prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
            prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
        _undumpable_users += 1
    try:
        yield
    finally:
        with _dumpable_lock:
            _undumpable_users -= 1
            if _undumpable_users == 0 and getattr(_undumpable, "saved", 1) > 0:
                prctl(4, _undumpable.saved, 0, 0, 0)


class _Spawn(NamedTuple):
    cmd: list[str]
    mode: str


def _sandbox_command(
    code_path: str,
    d: str,
    mode: str,
    *,
    timeout_s: float,
    memory_mb: int,
    max_processes: int,
    max_file_mb: int,
    network: bool,
    extra: dict | None = None,
) -> _Spawn:
    """The command that runs ``code_path`` in the sandbox directory ``d`` in ``mode`` (already resolved)."""
    env_info = probe.detect()
    in_userns = mode == "full" or (mode == "net" and not network)
    if in_userns and probe.kernel_version() >= (5, 14):
        nproc = max_processes + 2  # counted per user namespace; +unshare +the program itself
    elif os.geteuid() == 0:
        nproc = max_processes  # not enforced for root anyway
    else:
        nproc = _user_task_count(os.getuid()) + max_processes
    ns = mode if in_userns else "none"
    cfg = {
        "dir": d,
        "file": code_path,
        "ns": ns,
        "network": bool(network),
        "memory_mb": int(memory_mb),
        "file_mb": int(max_file_mb),
        "cpu_s": int(timeout_s) + 2,
        "nproc": int(nproc),
        "pid_max": env_info.pid_max and mode == "full",
        **(extra or {}),
    }
    prefix = probe.ns_prefix(mode, env_info.unshare, network) if in_userns and env_info.unshare else []
    return _Spawn(prefix + [sys.executable, "-I", "-B", "-c", probe.boot_source(), json.dumps(cfg)], ns)


def run_python(
    code: str,
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    max_processes: int = 32,
    max_file_mb: int = 16,
    network: bool = False,
    mode: str | None = None,
) -> SandboxResult:
    """Run ``code`` as a Python program in a fresh sandboxed subprocess; see the module docstring.

    ``status`` is "passed" iff the program exits with status 0: a program can claim that by exiting early,
    so a verdict on model-written code comes from :func:`run_tests` instead. ``mode``: see
    :func:`~loosespec.eval.sandbox_probe.resolve_mode` (raises :class:`LoosespecError` where it is not
    available). Never raises for anything the code does; an unusable sandbox gives status "error".
    """
    t0 = time.monotonic()
    mode = probe.resolve_mode(mode)
    if (missing := _no_interpreter(mode)) is not None:
        return missing
    with _program_dir(code) as (d, path):
        spawn = _sandbox_command(
            path,
            d,
            mode,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            max_processes=max_processes,
            max_file_mb=max_file_mb,
            network=network,
        )
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, _undumpable(mode != "full"):
            try:
                proc = subprocess.Popen(
                    spawn.cmd,
                    cwd=d,
                    env=probe.child_env(d),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    close_fds=True,
                    start_new_session=True,
                )
            except (OSError, ValueError, subprocess.SubprocessError) as e:
                return SandboxResult(
                    "error", None, "", f"could not start the sandbox: {e}", time.monotonic() - t0, mode
                )
            try:
                timed_out = _wait(proc.pid, t0 + timeout_s)
            finally:
                _kill_group(proc)
                rc = proc.wait()
            wall = time.monotonic() - t0
            stdout, stderr = _tail(out), _tail(err)
        return SandboxResult(_classify(rc, timed_out, stderr), rc, stdout, stderr, wall, mode)


def _no_interpreter(mode: str) -> SandboxResult | None:
    exe = sys.executable
    if not exe or not os.access(exe, os.X_OK):
        return SandboxResult("error", None, "", f"no usable Python interpreter: {exe!r}", 0.0, mode)
    return None


@contextlib.contextmanager
def _program_dir(code: str):
    """A new sandbox directory holding ``code`` as ``program.py``: yields (directory, program path); removed
    afterwards even if the code took permissions away inside it."""
    tmp = tempfile.TemporaryDirectory(prefix="loosespec-sbx-", ignore_cleanup_errors=True)
    d = os.path.realpath(tmp.name)
    try:
        path = os.path.join(d, "program.py")
        with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(code)
        yield d, path
    finally:
        _force_rmtree(d)
        tmp.cleanup()


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group: forked children too
    except (ProcessLookupError, PermissionError):
        pass


@functools.cache
def _driver_source() -> str:
    here = Path(__file__).parent
    return (
        (here / "sandbox_wire.py").read_text(encoding="utf-8")
        + "\n"
        + (here / "sandbox_driver.py").read_text(encoding="utf-8")
    )


def _wire_source() -> str:
    return (Path(__file__).parent / "sandbox_wire.py").read_text(encoding="utf-8")


VERDICT_MARK = "LOOSESPEC-VERDICT "


def run_tests(
    program: str,
    *,
    prompt: str,
    test: str,
    entry_point: str,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    max_processes: int = 32,
    max_file_mb: int = 16,
    mode: str | None = None,
) -> SandboxResult:
    """Test ``program`` (a prompt and the model's code, no tests) against ``test`` (a ``check(candidate)``
    function) so that the program cannot forge the verdict.

    Two processes: the program runs in the sandbox (``mode``, as :func:`run_python`), serving calls to
    ``entry_point``; a separate driver process runs the trusted ``prompt`` and ``test``, with ``entry_point``
    bound to a proxy that calls the program over two pipes and reads back plain data
    (:mod:`loosespec.eval.sandbox_wire`). The verdict is the driver's: "passed" iff ``check`` returned.
    "failed": the tests failed (an assertion, the program's exception, a program that exited or never loaded);
    "timeout"/"memory": so did the program under test (its limits, or the wall clock); "error": the driver
    itself failed (no verdict). ``stdout``/``stderr`` are the program's, ``detail`` the driver's reason.
    """
    t0 = time.monotonic()
    mode = probe.resolve_mode(mode)
    if (missing := _no_interpreter(mode)) is not None:
        return missing
    exe = sys.executable
    procs: list[subprocess.Popen] = []
    pipes = [*os.pipe(), *os.pipe()]  # requests: driver -> program; replies: program -> driver
    req_r, req_w, resp_r, resp_w = pipes
    with _program_dir(program) as (d, path):
        try:
            spawn = _sandbox_command(
                path,
                d,
                mode,
                timeout_s=timeout_s,
                memory_mb=memory_mb,
                max_processes=max_processes,
                max_file_mb=max_file_mb,
                network=False,
                extra={"serve": {"entry": entry_point, "req_fd": req_r, "resp_fd": resp_w}, "wire": _wire_source()},
            )
            driver_cfg = json.dumps(
                {"prompt": prompt, "test": test, "entry": entry_point, "req_fd": req_w, "resp_fd": resp_r}
            )
            with (
                tempfile.TemporaryFile() as out,
                tempfile.TemporaryFile() as err,
                tempfile.TemporaryFile() as dout,
                tempfile.TemporaryFile() as derr,
                tempfile.TemporaryFile() as din,
                tempfile.TemporaryDirectory(prefix="loosespec-drv-") as driver_dir,
                _undumpable(mode != "full"),
            ):
                din.write(driver_cfg.encode("utf-8", "surrogatepass"))
                din.seek(0)
                try:
                    procs.append(
                        subprocess.Popen(
                            spawn.cmd,
                            cwd=d,
                            env=probe.child_env(d),
                            stdin=subprocess.DEVNULL,
                            stdout=out,
                            stderr=err,
                            pass_fds=(req_r, resp_w),
                            start_new_session=True,
                        )
                    )
                    procs.append(
                        subprocess.Popen(
                            [exe, "-I", "-B", "-c", _driver_source()],
                            cwd=driver_dir,
                            env=probe.child_env(driver_dir),
                            stdin=din,
                            stdout=dout,
                            stderr=derr,
                            pass_fds=(req_w, resp_r),
                            start_new_session=True,
                        )
                    )
                except (OSError, ValueError, subprocess.SubprocessError) as e:
                    return SandboxResult(
                        "error", None, "", f"could not start the sandbox: {e}", time.monotonic() - t0, mode
                    )
                finally:
                    for fd in pipes:  # the children hold their ends: an exit closes the pipe for the other
                        os.close(fd)
                    pipes = []
                program_proc, driver = procs
                timed_out = _wait(driver.pid, t0 + timeout_s)
                program_ended = program_proc.poll() is not None
                for p in procs:
                    _kill_group(p)
                rc, driver_rc = program_proc.wait(), driver.wait()
                wall = time.monotonic() - t0
                stdout, stderr, dstdout, dstderr = _tail(out), _tail(err), _tail(dout), _tail(derr)
            verdict = None
            for line in reversed(dstdout.splitlines()):
                if line.startswith(VERDICT_MARK):
                    try:
                        verdict = json.loads(line[len(VERDICT_MARK) :])
                    except ValueError:
                        verdict = None
                    break
            if timed_out:
                status, detail = "timeout", f"no verdict within {timeout_s:g} s"
            elif not isinstance(verdict, dict) or "error" in verdict or driver_rc != 0:
                why = verdict.get("error") if isinstance(verdict, dict) else None
                status, detail = "error", why or f"the test driver gave no verdict (exit {driver_rc}): {dstderr[-500:]}"
            elif verdict.get("passed") is True:
                status, detail = "passed", ""
            else:
                own = _classify(rc, False, stderr) if program_ended else "failed"
                status = own if own in ("timeout", "memory") else "failed"
                detail = str(verdict.get("reason", ""))[:1000]
            return SandboxResult(status, rc if program_ended else None, stdout, stderr, wall, mode, detail)
        finally:
            for fd in pipes:
                os.close(fd)
            for p in procs:
                if p.returncode is None:
                    _kill_group(p)
                    p.wait()
