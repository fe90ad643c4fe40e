"""The sandbox child's bootstrap (loosespec.eval.sandbox): run as ``python -I -B -c <this file's text>
<json config>`` inside the sandbox, before the model-generated code.

Standard library only: the child is isolated and must not import loosespec (which pulls in torch).
A real module, so linters and tests see it; importing it does nothing (the work is under
``__main__``). It reads its configuration, installs the Python-level guard (file writes outside the
sandbox directory, process creation, rlimit changes and, unless allowed, the network are refused),
sets the resource limits and runs the program as ``__main__``.
"""

if __name__ == "__main__":
    import json
    import os
    import sys

    _cfg = json.loads(sys.argv[1])
    _dir = _cfg["dir"]

    def _fail(msg):
        sys.stderr.write("loosespec-sandbox: setup failed: %s\n" % msg)
        sys.stderr.flush()
        os._exit(97)

    if _cfg["ns"] == "full":
        import ctypes
        import re

        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
        _libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

        def _mount(src, dst, flags):
            if _libc.mount(src and os.fsencode(src), os.fsencode(dst), None, flags, None) != 0:
                e = ctypes.get_errno()
                raise OSError(e, os.strerror(e), dst)

        # 1. bound the number of processes: per-PID-namespace pid_max (kernel >= 6.14 only; on older
        #    kernels this file is the global one, so the parent only asks for it on new kernels)
        _cfg["pid_max_set"] = False
        if _cfg.get("pid_max"):
            try:
                with open("/proc/sys/kernel/pid_max", "w") as f:
                    f.write("301")
                _cfg["pid_max_set"] = True
            except OSError:
                pass

        # 2. everything read-only except the sandbox directory
        MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
        MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
        MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
        try:
            _mount(None, "/", MS_REC | MS_PRIVATE)
            _mount(_dir, _dir, MS_BIND | MS_REC)
            with open("/proc/self/mountinfo", "rb") as f:
                _points = []
                for line in f:
                    raw = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), line.split()[4])
                    _points.append(os.fsdecode(raw))  # octal escapes (\040 = space) decoded
        except OSError as e:
            _fail("sandbox dir bind mount: %s" % e)
        _bad = []
        for mp in sorted(set(_points)):
            if mp == _dir or mp.startswith(_dir.rstrip("/") + "/"):
                continue
            try:
                fl = os.statvfs(mp).f_flag
            except OSError:
                continue  # hidden or vanished mount point: not reachable by path either
            if fl & os.ST_RDONLY:
                continue
            flags = MS_REMOUNT | MS_BIND | MS_RDONLY
            for st, ms in (
                (os.ST_NOSUID, MS_NOSUID),
                (os.ST_NODEV, MS_NODEV),
                (os.ST_NOEXEC, MS_NOEXEC),
                (os.ST_NOATIME, MS_NOATIME),
                (os.ST_NODIRATIME, MS_NODIRATIME),
                (os.ST_RELATIME, MS_RELATIME),
            ):
                if fl & st:
                    flags |= ms
            if not fl & (os.ST_NOATIME | os.ST_RELATIME):
                flags |= MS_STRICTATIME
            try:
                _mount(None, mp, flags)
            except OSError as e:
                _bad.append("%s (%s)" % (mp, e.strerror))
        for mp in sorted(set(_points)):
            if mp == _dir or mp.startswith(_dir.rstrip("/") + "/"):
                continue
            try:
                if not os.statvfs(mp).f_flag & os.ST_RDONLY:
                    _bad.append(mp)
            except OSError:
                pass
        if _bad:
            _fail("could not make read-only: " + ", ".join(sorted(set(_bad))))

        # 3. drop every capability so the code cannot remount anything
        PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
        for cap in range(64):
            _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
        _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)

        class _CapHdr(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class _CapData(ctypes.Structure):
            _fields_ = [
                ("effective", ctypes.c_uint32),
                ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32),
            ]

        if _libc.capset(ctypes.byref(_CapHdr(0x20080522, 0)), (_CapData * 2)()) != 0:
            _fail("capset: %s" % os.strerror(ctypes.get_errno()))
        _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        with open("/proc/self/status") as f:
            _caps = {l.split(":")[0]: l.split(":")[1].strip() for l in f if l.startswith("Cap")}
        if int(_caps.get("CapEff", "1"), 16) or int(_caps.get("CapBnd", "1"), 16):
            _fail("capabilities still present: %r" % _caps)

    if _cfg.get("probe"):
        ok_ro = ok_net = False
        if _cfg["ns"] == "full":
            victim = os.path.join(os.path.dirname(_dir), ".loosespec-sandbox-probe-%d" % os.getpid())
            try:
                open(victim, "w").close()
                os.unlink(victim)
            except OSError as e:
                import errno

                ok_ro = e.errno == errno.EROFS
        # network isolation itself, not an unreachable address (which any offline host also gives): a
        # network namespace other than the parent's, with the loopback device as its only interface
        try:
            with open("/proc/self/net/dev") as f:
                _ifaces = sorted(line.split(":")[0].strip() for line in f.readlines()[2:] if ":" in line)
            ok_net = os.readlink("/proc/self/ns/net") != _cfg["parent_netns"] and _ifaces == ["lo"]
        except (OSError, KeyError):
            ok_net = False
        print(
            "loosespec-sandbox-probe-ok",
            json.dumps({"ro": ok_ro, "net": ok_net, "pid_max": bool(_cfg.get("pid_max_set"))}),
        )
        sys.exit(0)

    # serve mode (run_tests): the wire to the test driver, loaded before the guard
    _serve = _cfg.get("serve")
    _wire = {}
    if _serve:
        exec(compile(_cfg["wire"], "<sandbox_wire>", "exec"), _wire)

    # no PID/network namespace: a seccomp filter refuses, below any Python-level trick, sockets other than
    # AF_UNIX, io_uring (which can open sockets), ptrace and process_vm_readv/writev (another process's memory),
    # and every syscall of a foreign ABI (x32, i386's int 0x80) that could reach them by other numbers
    _cfg["seccomp"] = False
    if _cfg["ns"] == "none" and not _cfg["network"]:
        try:
            import ctypes
            import platform
            import struct

            _arch = {
                "x86_64": (
                    0xC000003E,
                    {"socket": 41, "ptrace": 101, "vm_readv": 310, "vm_writev": 311, "io_uring_setup": 425},
                    True,
                ),
                "aarch64": (
                    0xC00000B7,
                    {"socket": 198, "ptrace": 117, "vm_readv": 270, "vm_writev": 271, "io_uring_setup": 425},
                    False,
                ),
            }.get(platform.machine())
            if _arch is not None:
                _audit, _nr, _x32 = _arch
                LD_W_ABS, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06
                ALLOW, DENY = 0x7FFF0000, 0x00050000 | 13  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EACCES
                # (code, jump-if-true label, jump-if-false label, k); labels resolved to relative offsets below
                prog = [
                    (LD_W_ABS, None, None, 4),  # seccomp_data.arch
                    (JEQ, None, "deny", _audit),  # a foreign ABI: deny
                    (LD_W_ABS, None, None, 0),
                ]  # seccomp_data.nr
                if _x32:
                    prog.append((JGE, "deny", None, 0x40000000))  # x32 numbers
                prog.append((JEQ, "domain", None, _nr["socket"]))
                for _n in ("ptrace", "vm_readv", "vm_writev", "io_uring_setup"):
                    prog.append((JEQ, "deny", None, _nr[_n]))
                prog += [
                    (RET, None, None, ALLOW),
                    ("deny", RET, None, None, DENY),
                    ("domain", LD_W_ABS, None, None, 16),  # socket's args[0] (low 32 bits): domain
                    (JEQ, None, "deny2", 1),  # AF_UNIX
                    (RET, None, None, ALLOW),
                    ("deny2", RET, None, None, DENY),
                ]
                labels, plain = {}, []
                for ins in prog:
                    if isinstance(ins[0], str):
                        labels[ins[0]] = len(plain)
                        ins = ins[1:]
                    plain.append(ins)
                prog = [
                    (code, 0 if jt is None else labels[jt] - i - 1, 0 if jf is None else labels[jf] - i - 1, k)
                    for i, (code, jt, jf, k) in enumerate(plain)
                ]
                raw = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
                _buf = ctypes.create_string_buffer(raw, len(raw))

                class _Fprog(ctypes.Structure):
                    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

                _libc_s = ctypes.CDLL(None, use_errno=True)
                _libc_s.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
                _fp = _Fprog(len(prog), ctypes.cast(_buf, ctypes.c_void_p))
                if (
                    _libc_s.prctl(38, 1, None, 0, 0) == 0
                    and _libc_s.prctl(22, 2, ctypes.cast(ctypes.pointer(_fp), ctypes.c_void_p), 0, 0) == 0
                ):
                    _cfg["seccomp"] = True  # PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP SECCOMP_MODE_FILTER
        except Exception:
            pass

    # the real setrlimit, captured before the guard below replaces it
    import resource as _resource_mod

    _real_setrlimit = _resource_mod.setrlimit
    # ---- Python-level guard (defence in depth; bypassable with ctypes) ----
    import _io
    import _posixsubprocess
    import builtins
    import io
    import posix
    import resource
    import shutil
    import subprocess
    import types

    _realpath, _join, _dirname, _basename = os.path.realpath, os.path.join, os.path.dirname, os.path.basename
    _readlink, _fspath, _fsdecode, _getcwd = os.readlink, os.fspath, os.fsdecode, os.getcwd
    _root = _realpath(_dir)

    def _deny(what):
        def denied(*args, **kwargs):
            raise PermissionError(1, "blocked by loosespec sandbox: " + what)

        denied.__name__ = what.rsplit(".", 1)[-1]
        return denied

    def _resolve(path, dir_fd=None, follow=True):
        if isinstance(path, int):
            return None
        p = _fsdecode(_fspath(path))
        base = _readlink("/proc/self/fd/%d" % dir_fd) if dir_fd is not None else _getcwd()
        p = _join(base, p)
        if follow:
            return _realpath(p)
        return _join(_realpath(_dirname(p) or "/"), _basename(p))

    def _inside(path, dir_fd=None, follow=True):
        try:
            r = _resolve(path, dir_fd, follow)
        except (OSError, TypeError, ValueError):
            return False
        return r is not None and (r == _root or r.startswith(_root + "/"))

    def _path_guard(mod, name, nargs=1, follow=True, allow_fd=False):
        orig = getattr(mod, name, None)
        if orig is None:
            return

        def guarded(*args, **kwargs):
            dir_fd = kwargs.get("dir_fd")
            names = ("path", "name") if nargs == 1 else ("src", "dst")
            fds = (dir_fd,) if nargs == 1 else (kwargs.get("src_dir_fd", dir_fd), kwargs.get("dst_dir_fd", dir_fd))
            checks = list(zip(args[:nargs], fds))
            for i, k in enumerate(names):
                if k in kwargs:
                    checks.append((kwargs[k], fds[min(i, len(fds) - 1)]))
            for p, fd in checks:
                if isinstance(p, int) and allow_fd:
                    continue
                if not _inside(p, fd, follow):
                    raise PermissionError(1, "blocked by loosespec sandbox: %s outside the sandbox dir" % name, str(p))
            return orig(*args, **kwargs)

        guarded.__name__ = name
        for m in (mod, posix) if mod is os else (mod,):
            if hasattr(m, name):
                setattr(m, name, guarded)

    for _name in ("remove", "unlink", "rmdir", "removedirs", "mkfifo", "mknod", "setxattr", "removexattr"):
        _path_guard(os, _name, follow=False)
    for _name in ("rename", "renames", "replace", "link"):
        _path_guard(os, _name, nargs=2, follow=False)
    for _name in ("chmod", "lchmod", "mkdir", "makedirs", "utime", "chflags", "lchflags"):
        _path_guard(os, _name)
    _path_guard(os, "truncate", allow_fd=True)
    _orig_symlink = os.symlink

    def _symlink(src, dst, *a, **k):
        if not _inside(dst, k.get("dir_fd"), follow=False):
            raise PermissionError(1, "blocked by loosespec sandbox: symlink outside the sandbox dir", str(dst))
        return _orig_symlink(src, dst, *a, **k)

    os.symlink = posix.symlink = _symlink
    _path_guard(shutil, "rmtree", follow=False)
    _path_guard(shutil, "move", nargs=2, follow=False)

    _WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    _own_pid = str(os.getpid())

    def _resolve_safe(path, dir_fd=None):
        try:
            return _resolve(path, dir_fd)
        except Exception:
            return None

    def _check_open(path, writing, dir_fd=None):
        """Writing only inside the sandbox dir (and /dev/null); no other process's /proc entries at all (its
        environment, memory, open files)."""
        if isinstance(path, int):
            return
        r = _resolve_safe(path, dir_fd)
        if r is not None and r.startswith("/proc/"):
            first = r.split("/")[2]
            if first.isdigit() and first != _own_pid:
                raise PermissionError(1, "blocked by loosespec sandbox: another process's /proc entries", str(path))
        if writing and not _inside(path, dir_fd) and r != "/dev/null":
            raise PermissionError(
                1, "blocked by loosespec sandbox: open for writing outside the sandbox dir", str(path)
            )

    _orig_os_open = os.open

    def _os_open(path, flags, *a, **k):
        _check_open(path, flags & _WRITE_FLAGS, k.get("dir_fd"))
        return _orig_os_open(path, flags, *a, **k)

    os.open = posix.open = _os_open

    _orig_open = _io.open

    def _open(file, mode="r", *a, **k):
        _check_open(file, any(c in str(mode) for c in "wax+"))
        return _orig_open(file, mode, *a, **k)

    builtins.open = io.open = _io.open = _open

    class _FileIO(_io.FileIO):  # io.FileIO(path, "w") opens without open()
        def __init__(self, file, mode="r", *a, **k):
            _check_open(file, any(c in str(mode) for c in "wax+"))
            super().__init__(file, mode, *a, **k)

    _FileIO.__name__ = _FileIO.__qualname__ = "FileIO"
    io.FileIO = _io.FileIO = _FileIO

    # modules that open files or run code below the guard: native calls (ctypes, cffi), databases that
    # create files natively (sqlite3, dbm), shared memory in /dev/shm, sub-interpreters (a fresh, unguarded
    # os and io) and CPython's test hooks. Python-level, like the rest of this guard.
    _BLOCKED = frozenset(
        (
            "ctypes",
            "_ctypes",
            "cffi",
            "_cffi_backend",
            "sqlite3",
            "_sqlite3",
            "dbm",
            "_dbm",
            "_gdbm",
            "_posixshmem",
            "_xxsubinterpreters",
            "_xxinterpchannels",
            "_interpreters",
            "_interpchannels",
            "_interpqueues",
            "_testcapi",
            "_testinternalcapi",
            "_testmultiphase",
            "_testsinglephase",
            "_testimportmultiple",
        )
    )

    class _ImportGuard:
        loosespec_guard = True

        @staticmethod
        def find_spec(name, path=None, target=None):
            if name.split(".")[0] in _BLOCKED:
                raise ImportError("blocked by loosespec sandbox: import %s" % name, name=name)
            return None

    for _m in [m for m in sys.modules if m.split(".")[0] in _BLOCKED]:
        del sys.modules[_m]
    sys.meta_path.insert(0, _ImportGuard())

    for _name in (
        "fork",
        "forkpty",
        "system",
        "popen",
        "execv",
        "execve",
        "execl",
        "execle",
        "execlp",
        "execlpe",
        "execvp",
        "execvpe",
        "spawnl",
        "spawnle",
        "spawnlp",
        "spawnlpe",
        "spawnv",
        "spawnve",
        "spawnvp",
        "spawnvpe",
        "posix_spawn",
        "posix_spawnp",
        "kill",
        "killpg",
        "setsid",
        "setpgid",
        "setpgrp",
        "chown",
        "lchown",
        "fchown",
        "fchmod",
        "chroot",
        "setuid",
        "setgid",
        "seteuid",
        "setegid",
        "setreuid",
        "setregid",
        "setresuid",
        "setresgid",
        "plock",
        "unshare",
        "setns",
    ):
        for _m in (os, posix):
            if hasattr(_m, _name):
                setattr(_m, _name, _deny("os." + _name))
    _posixsubprocess.fork_exec = _deny("_posixsubprocess.fork_exec")
    import signal as _signal_mod

    if hasattr(_signal_mod, "pidfd_send_signal"):  # a signal to another process by pidfd, not pid
        _signal_mod.pidfd_send_signal = _deny("signal.pidfd_send_signal")
    shutil.chown = _deny("shutil.chown")
    resource.setrlimit = _deny("resource.setrlimit")
    if hasattr(resource, "prlimit"):
        resource.prlimit = _deny("resource.prlimit")

    class _Popen(subprocess.Popen):
        def __init__(self, *a, **k):
            raise PermissionError(1, "blocked by loosespec sandbox: subprocess")

        def __del__(self):
            pass

    subprocess.Popen = _Popen

    if not _cfg["network"]:
        import _socket
        import socket

        class _Socket(socket.socket):
            def __init__(self, *a, **k):
                raise PermissionError(1, "blocked by loosespec sandbox: network")

            def __del__(self):
                pass

        class _RawSocket(_socket.socket):
            def __init__(self, *a, **k):
                raise PermissionError(1, "blocked by loosespec sandbox: network")

        socket.socket = socket.SocketType = _Socket
        _socket.socket = _socket.SocketType = _RawSocket
        for _name in (
            "create_connection",
            "create_server",
            "getaddrinfo",
            "gethostbyname",
            "gethostbyname_ex",
            "gethostbyaddr",
            "getnameinfo",
            "socketpair",
            "fromfd",
            "sethostname",
        ):
            for _m in (socket, _socket):
                if hasattr(_m, _name):
                    setattr(_m, _name, _deny("socket." + _name))

    def _limit(res, soft, hard=None):
        try:
            _real_setrlimit(res, (soft, soft if hard is None else hard))
        except (ValueError, OSError):
            pass

    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_CPU, _cfg["cpu_s"], _cfg["cpu_s"] + 1)
    _limit(resource.RLIMIT_FSIZE, _cfg["file_mb"] * 1024 * 1024)
    if _cfg.get("nproc") is not None:
        _limit(resource.RLIMIT_NPROC, _cfg["nproc"])
    os.chdir(_dir)
    sys.argv = [_cfg["file"]]
    _main = types.ModuleType("__main__")
    _main.__file__ = _cfg["file"]
    _main.__builtins__ = builtins
    with _orig_open(_cfg["file"], "rb") as _f:
        _src = _f.read()
    sys.modules["__main__"] = _main
    _code = compile(_src, _cfg["file"], "exec")
    _limit(resource.RLIMIT_AS, _cfg["memory_mb"] * 1024 * 1024)
    del _src, _f
    if not _serve:
        exec(_code, _main.__dict__)
    else:  # run_tests: load the program, then answer the driver's calls to its entry point
        _send, _recv, _to, _from, _WireError = (_wire[n] for n in ("send", "recv", "to_data", "from_data", "WireError"))
        _req, _resp, _entry = _serve["req_fd"], _serve["resp_fd"], _serve["entry"]
        _objects, _ids = [], {}

        def _handle_out(v):  # an instance of the program's own class stays here; the driver gets its number
            if isinstance(v, type) or getattr(type(v), "__module__", None) != "__main__":
                return None
            k = _ids.get(id(v))
            if k is None:
                k = _ids[id(v)] = len(_objects)
                _objects.append(v)
            return k

        def _handle_in(k):
            if 0 <= k < len(_objects):
                return _objects[k]
            raise _WireError("unknown handle %d" % k)

        def _own_class(name):
            cls = _main.__dict__.get(name)
            if not isinstance(cls, type) or cls.__module__ != "__main__":
                raise NameError("the program defines no class %r" % (name,))
            return cls

        def _describe(e):
            try:
                return [type(e).__name__, str(e)[:500]]
            except BaseException:
                return [type(e).__name__, "?"]

        try:
            exec(_code, _main.__dict__)
        except BaseException as _e:
            try:
                _send(_resp, {"load_error": ": ".join(_describe(_e))})
            except BaseException:
                pass
            raise
        _send(
            _resp,
            {
                "ready": True,
                "classes": [
                    n for n, v in list(_main.__dict__.items()) if isinstance(v, type) and v.__module__ == "__main__"
                ][:100],
            },
        )
        while True:
            try:
                _msg = _recv(_req)
            except _WireError:
                os._exit(0)  # the driver is done
            try:
                if "call" in _msg:
                    _args, _kwargs = _msg["call"]
                    _value = _main.__dict__[_entry](*_from(_args, 0, _handle_in), **_from(_kwargs, 0, _handle_in))
                elif "new" in _msg:
                    _name, _args, _kwargs = _msg["new"]
                    _value = _own_class(_name)(*_from(_args, 0, _handle_in), **_from(_kwargs, 0, _handle_in))
                elif "setattr" in _msg:
                    _k, _name, _v = _msg["setattr"]
                    _value = setattr(_handle_in(_k), str(_name), _from(_v, 0, _handle_in))
                elif "getattr" in _msg:
                    _k, _name = _msg["getattr"]
                    _value = getattr(_handle_in(_k), str(_name))
                else:
                    raise ValueError("unknown request")
                _reply = {"ok": _to(_value, 0, _handle_out)}
            except BaseException as _e:  # SystemExit too: the call did not return
                _reply = {"raise": _describe(_e)}
            _send(_resp, _reply)
