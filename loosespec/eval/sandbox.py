"""Run untrusted Python (model-generated HumanEval completions) in a throw-away, limited subprocess.

:func:`run_python` is the only way loosespec executes generated code. Each call starts a fresh
``python -I -B`` process and returns a :class:`SandboxResult`; it never raises for anything the code
does. The rule for scoring is simple: **exit status 0 means passed**. HumanEval's ``check()`` raises
``AssertionError`` on a wrong answer, which gives a non-zero status. A completion that calls
``sys.exit(0)`` / ``exit()`` / ``os._exit(0)`` *before* the checks run therefore counts as passed;
the caller is expected to put the checks where the completion cannot skip them (loosespec's
HumanEval scorer also requires a per-run secret printed after ``check()``), or to accept that.

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
  opened for writing). Unless ``network=True``, ``socket.socket``, ``socket.create_connection``,
  ``getaddrinfo`` and friends raise ``PermissionError``.

Namespaces (the real barrier, where available)
----------------------------------------------
On first use the module probes (once per process, cached) whether util-linux ``unshare`` can create
user + mount + PID + network (+ IPC, UTS) namespaces, and checks inside that the isolation really
holds. Modes, best first (see :func:`sandbox_mode`):

``"full"``
    ``unshare --user --map-root-user --mount --pid --fork --mount-proc --ipc --uts [--net]
    --kill-child``. Inside, before the code runs, the bootstrap bind-mounts the sandbox directory
    onto itself and remounts **every other mount read-only** (``/proc`` and ``/sys`` included), so
    files outside the sandbox directory cannot be deleted, truncated or created even by code that
    bypasses the Python guard (e.g. through ``ctypes``). On kernels >= 6.14 it lowers the PID
    namespace's ``kernel.pid_max`` to its minimum (301), which bounds the number of processes in the
    sandbox to about 300 even when running as root. It then drops every capability (bounding set,
    ambient set, effective/permitted; ``no_new_privs``), so the code cannot undo the read-only
    mounts. The code runs as PID 1 of its own PID namespace: when it exits or is killed, the kernel
    kills every process it started, including ones that left the process group with ``setsid``.
    Unless ``network=True`` (which leaves out ``--net``), the network namespace has only a down
    loopback device: connects fail with ENETUNREACH. The probe checks the isolation itself (a network
    namespace other than the parent's, with ``lo`` its only interface), not an unreachable address,
    which an offline host gives too.
``"net"``
    ``unshare --user --map-root-user --net`` only (no read-only mounts, no PID namespace): network
    isolation is real; file and process protection is the Python guard, the rlimits and the
    process-group kill.
``"none"``
    Plain subprocess (e.g. CI containers that forbid user namespaces): everything except the
    rlimits and the process-group kill is the Python-level guard.

What is NOT protected
---------------------
* In ``"net"`` and ``"none"`` mode the file and network guards are Python-level only: ``ctypes``,
  ``importlib`` tricks or a C extension bypass them. Use ``"full"`` mode (or a container / VM)
  for real hostile code.
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

import functools
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
import time
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["SandboxResult", "run_python", "sandbox_mode"]

_TAIL_CHARS = 2000
_SETUP_FAILED_RC = 97
_SETUP_FAILED_MARK = "loosespec-sandbox: setup failed"
_PROBE_OK_MARK = "loosespec-sandbox-probe-ok"


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

    @property
    def passed(self) -> bool:
        return self.status == "passed"


# ----------------------------------------------------------------------------------- child bootstrap
# Runs as ``python -I -B -c <loosespec/eval/sandbox_boot.py> <json config>`` inside the sandbox.

@functools.cache
def _boot_source() -> str:
    """The child's bootstrap: the text of :mod:`loosespec.eval.sandbox_boot` (read once), passed with ``python -c``."""
    return Path(__file__).with_name("sandbox_boot.py").read_text(encoding="utf-8")


# ----------------------------------------------------------------------------------------- probing

class _Env(NamedTuple):
    mode: str           # "full", "net" or "none"
    unshare: str | None
    pid_max: bool       # per-namespace pid_max available (kernel >= 6.14) and set in the probe


def _kernel_version() -> tuple[int, int]:
    try:
        parts = platform.release().split(".")
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def _ns_prefix(mode: str, unshare: str, network: bool) -> list[str]:
    if mode == "full":
        cmd = [unshare, "--user", "--map-root-user", "--mount", "--pid", "--fork", "--mount-proc",
               "--ipc", "--uts", "--kill-child"]
        if not network:
            cmd.append("--net")
        return cmd
    if mode == "net" and not network:
        return [unshare, "--user", "--map-root-user", "--net"]
    return []


def _netns() -> str | None:
    """This process's network namespace (``net:[inode]``), None where Linux's /proc does not say."""
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return None


def _probe(mode: str, unshare: str) -> dict | None:
    with tempfile.TemporaryDirectory(prefix="loosespec-sbx-probe-") as d:
        d = os.path.realpath(d)
        cfg = {"dir": d, "ns": mode, "probe": True, "network": False, "parent_netns": _netns(),
               "pid_max": mode == "full" and _kernel_version() >= (6, 14)}
        cmd = _ns_prefix(mode, unshare, False) + [sys.executable, "-I", "-B", "-c", _boot_source(),
                                                  json.dumps(cfg)]
        try:
            p = subprocess.run(cmd, cwd=d, env=_child_env(d), stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=20, start_new_session=True)
        except (OSError, subprocess.SubprocessError):
            return None
    if p.returncode != 0:
        return None
    for line in p.stdout.decode("utf-8", "replace").splitlines():
        if line.startswith(_PROBE_OK_MARK):
            try:
                return json.loads(line[len(_PROBE_OK_MARK):])
            except ValueError:
                return None
    return None


@functools.lru_cache(maxsize=1)
def _detect() -> _Env:
    unshare = shutil.which("unshare") or next(
        (p for p in ("/usr/bin/unshare", "/bin/unshare") if os.access(p, os.X_OK)), None)
    if unshare and sys.platform.startswith("linux"):
        r = _probe("full", unshare)
        if r and r.get("ro") and r.get("net"):
            return _Env("full", unshare, bool(r.get("pid_max")))
        r = _probe("net", unshare)
        if r and r.get("net"):
            return _Env("net", unshare, False)
    return _Env("none", None, False)


def sandbox_mode() -> str:
    """The isolation this machine gives :func:`run_python`: "full", "net" or "none" (see the module
    docstring). Probed once per process."""
    return _detect().mode


# ------------------------------------------------------------------------------------------ running

def _child_env(d: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": d, "TMPDIR": d, "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8"}


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


def run_python(code: str, *, timeout_s: float = 10.0, memory_mb: int = 1024, max_processes: int = 32,
               max_file_mb: int = 16, network: bool = False) -> SandboxResult:
    """Run ``code`` as a Python program in a fresh sandboxed subprocess; see the module docstring.

    ``status`` is "passed" iff the program exits with status 0. Never raises for anything the code
    does; an unusable sandbox gives status "error".
    """
    t0 = time.monotonic()
    env_info = _detect()
    exe = sys.executable
    if not exe or not os.access(exe, os.X_OK):
        return SandboxResult("error", None, "", f"no usable Python interpreter: {exe!r}", 0.0)
    tmp = tempfile.TemporaryDirectory(prefix="loosespec-sbx-", ignore_cleanup_errors=True)
    d = os.path.realpath(tmp.name)
    proc = None
    try:
        path = os.path.join(d, "program.py")
        with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(code)
        in_userns = env_info.mode == "full" or (env_info.mode == "net" and not network)
        if in_userns and _kernel_version() >= (5, 14):
            nproc = max_processes + 2  # counted per user namespace; +unshare +the program itself
        elif os.geteuid() == 0:
            nproc = max_processes  # not enforced for root anyway
        else:
            nproc = _user_task_count(os.getuid()) + max_processes
        cfg = {"dir": d, "file": path, "ns": env_info.mode if not (env_info.mode == "net" and network) else "none",
               "network": bool(network), "memory_mb": int(memory_mb), "file_mb": int(max_file_mb),
               "cpu_s": int(timeout_s) + 2, "nproc": int(nproc), "pid_max": env_info.pid_max}
        cmd = ([] if env_info.unshare is None else _ns_prefix(env_info.mode, env_info.unshare, network)) \
            + [exe, "-I", "-B", "-c", _boot_source(), json.dumps(cfg)]
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(cmd, cwd=d, env=_child_env(d), stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=err, close_fds=True, start_new_session=True)
            except (OSError, ValueError, subprocess.SubprocessError) as e:
                return SandboxResult("error", None, "", f"could not start the sandbox: {e}",
                                     time.monotonic() - t0)
            timed_out = _wait(proc.pid, t0 + timeout_s)
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the group: forked children too
            except (ProcessLookupError, PermissionError):
                pass
            rc = proc.wait()
            wall = time.monotonic() - t0
            stdout, stderr = _tail(out), _tail(err)
        return SandboxResult(_classify(rc, timed_out, stderr), rc, stdout, stderr, wall)
    finally:
        if proc is not None and proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        _force_rmtree(d)
        tmp.cleanup()
