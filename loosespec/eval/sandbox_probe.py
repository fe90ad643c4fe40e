"""Which isolation this machine gives the sandbox (:mod:`loosespec.eval.sandbox`), probed once per process, and
the mode a run uses (:func:`resolve_mode`): ``"auto"`` takes the best this machine gives and refuses ``"none"``,
which must be asked for by name (``--sandbox none`` or ``$LOOSESPEC_SANDBOX``).

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
    Plain subprocess, only when asked for by name (e.g. CI containers that forbid user namespaces):
    the rlimits, the process-group kill and the seccomp filter are real; file protection is the
    Python-level guard only.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "MODES",
    "NO_SANDBOX",
    "Env",
    "boot_source",
    "child_env",
    "detect",
    "kernel_version",
    "ns_prefix",
    "resolve_mode",
    "sandbox_mode",
]

_PROBE_OK_MARK = "loosespec-sandbox-probe-ok"


# ----------------------------------------------------------------------------------- child bootstrap
# Runs as ``python -I -B -c <loosespec/eval/sandbox_boot.py> <json config>`` inside the sandbox.


@functools.cache
def boot_source() -> str:
    """The child's bootstrap: the text of :mod:`loosespec.eval.sandbox_boot` (read once), passed with ``python -c``."""
    return Path(__file__).with_name("sandbox_boot.py").read_text(encoding="utf-8")


# ----------------------------------------------------------------------------------------- probing


class Env(NamedTuple):
    """What :func:`detect` found: the best mode, the ``unshare`` it runs, whether ``pid_max`` is lowered."""

    mode: str  # "full", "net" or "none"
    unshare: str | None
    pid_max: bool  # per-namespace pid_max available (kernel >= 6.14) and set in the probe


def kernel_version() -> tuple[int, int]:
    """This kernel's (major, minor); (0, 0) where the release does not say."""
    try:
        parts = platform.release().split(".")
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def ns_prefix(mode: str, unshare: str, network: bool) -> list[str]:
    """The ``unshare`` command line a child of ``mode`` runs under (none for ``"none"``, or ``"net"`` with
    ``network``)."""
    if mode == "full":
        cmd = [
            unshare,
            "--user",
            "--map-root-user",
            "--mount",
            "--pid",
            "--fork",
            "--mount-proc",
            "--ipc",
            "--uts",
            "--kill-child",
        ]
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
        cfg = {
            "dir": d,
            "ns": mode,
            "probe": True,
            "network": False,
            "parent_netns": _netns(),
            "pid_max": mode == "full" and kernel_version() >= (6, 14),
        }
        cmd = ns_prefix(mode, unshare, False) + [sys.executable, "-I", "-B", "-c", boot_source(), json.dumps(cfg)]
        try:
            p = subprocess.run(
                cmd,
                cwd=d,
                env=child_env(d),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=20,
                start_new_session=True,
            )
        except (OSError, subprocess.SubprocessError):
            return None
    if p.returncode != 0:
        return None
    for line in p.stdout.decode("utf-8", "replace").splitlines():
        if line.startswith(_PROBE_OK_MARK):
            try:
                return json.loads(line[len(_PROBE_OK_MARK) :])
            except ValueError:
                return None
    return None


@functools.lru_cache(maxsize=1)
def detect() -> Env:
    """The best mode this machine gives, probed with a real child (each mode's isolation checked inside it)."""
    unshare = shutil.which("unshare") or next(
        (p for p in ("/usr/bin/unshare", "/bin/unshare") if os.access(p, os.X_OK)), None
    )
    if unshare and sys.platform.startswith("linux"):
        r = _probe("full", unshare)
        if r and r.get("ro") and r.get("net"):
            return Env("full", unshare, bool(r.get("pid_max")))
        r = _probe("net", unshare)
        if r and r.get("net"):
            return Env("net", unshare, False)
    return Env("none", None, False)


def sandbox_mode() -> str:
    """The isolation this machine gives :func:`loosespec.eval.sandbox.run_python`: "full", "net" or "none" (see
    the module docstring). Probed once per process."""
    return detect().mode


def child_env(d: str) -> dict[str, str]:
    """The whole environment of a sandbox child whose directory is ``d``: nothing of this process's."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": d, "TMPDIR": d, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


MODES = ("auto", "full", "net", "none")
_MODE_ENV = "LOOSESPEC_SANDBOX"
NO_SANDBOX = (
    "this machine gives the sandbox no isolation ({why}): model-written code would run with only the "
    "Python-level guard, which ctypes, introspection and root bypass. Run where user namespaces are "
    "allowed, or pass --sandbox none (LOOSESPEC_SANDBOX=none) to accept that; see docs/bench.md, "
    "'Evaluation'"
)


def _why_not() -> str:
    if not sys.platform.startswith("linux"):
        return f"{sys.platform} has no Linux namespaces"
    if detect().unshare is None:
        return "util-linux unshare is not installed"
    return (
        "unshare could not create user namespaces: Docker's default seccomp profile, or "
        "kernel.apparmor_restrict_unprivileged_userns / user.max_user_namespaces, forbid them"
    )


def resolve_mode(requested: str | None = None) -> str:
    """The sandbox mode a run uses: ``requested`` (None: ``$LOOSESPEC_SANDBOX``, else ``"auto"``).

    ``"auto"`` is the best this machine gives, and refuses ``"none"``: running model code with no isolation
    must be asked for by name. ``"full"`` and ``"net"`` must be available (``"net"`` is also given where
    ``"full"`` is). Raises :class:`LoosespecError` with a one-line reason."""
    from loosespec.errors import LoosespecError

    mode = (requested if requested is not None else os.environ.get(_MODE_ENV) or "auto").strip().lower()
    if mode not in MODES:
        raise LoosespecError(f"unknown sandbox mode {mode!r}; choose one of: {', '.join(MODES)}")
    best = detect().mode
    if mode == "auto":
        if best == "none":
            raise LoosespecError(NO_SANDBOX.format(why=_why_not()))
        return best
    if mode == "full" and best != "full" or mode == "net" and best == "none":
        raise LoosespecError(f"sandbox mode {mode!r} is not available here (best: {best!r}; {_why_not()})")
    return mode
