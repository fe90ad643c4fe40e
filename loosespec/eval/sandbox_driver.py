"""The HumanEval test driver (loosespec.eval.sandbox.run_tests): run as ``python -I -B -c <sandbox_wire.py's text
+ this file's text>`` with its configuration on standard input.

The driver runs the *trusted* half of a test: the problem's prompt (its imports and helpers, e.g. HumanEval's
``poly``) and its test code, with the function under test replaced by a proxy that calls the program in the
sandbox over two pipes (:mod:`loosespec.eval.sandbox_wire`). The model-written code never runs in this process,
so it cannot reach the verdict: not through the exit status, not through a printed marker, not by patching
``check``. Standard library only (isolated interpreter); importing this module does nothing.

It prints one line ``LOOSESPEC-VERDICT {json}`` as its last output: ``{"passed": true}``, or ``{"passed": false,
"reason": ...}`` when the tests failed (any exception in them, the program's included, as when they run in one
process), or ``{"error": ...}`` when the driver itself could not run the problem's own code.
"""

if __name__ == "__main__":
    import builtins
    import json
    import sys
    import traceback

    VERDICT = "LOOSESPEC-VERDICT "

    def _verdict(**fields):
        sys.stdout.write("\n" + VERDICT + json.dumps(fields) + "\n")
        sys.stdout.flush()
        sys.exit(0)

    try:  # not dumpable: another process of this user cannot read or write this one through /proc or ptrace
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    except Exception:
        pass

    cfg = json.loads(sys.stdin.read())
    req_fd, resp_fd, entry = cfg["req_fd"], cfg["resp_fd"], cfg["entry"]

    class ProgramError(Exception):
        """The program under test raised an exception of a type that is not a builtin one."""

    class ProgramGone(Exception):
        """The program under test stopped answering (it exited, was killed, or wrote nonsense)."""

    def _raised(name, message):
        cls = getattr(builtins, name, None) if isinstance(name, str) else None
        text = "%s (raised by the program under test)" % (message,)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                return cls(text)
            except Exception:
                pass
        return ProgramError("%s: %s" % (name, text))

    def _rpc(message):
        try:
            send(req_fd, message)
            reply = recv(resp_fd)
        except WireError as e:
            raise ProgramGone(str(e)) from None
        if "ok" in reply:
            try:
                return from_data(reply["ok"], 0, _remote)
            except WireError as e:
                raise ProgramGone(str(e)) from None
        if "raise" in reply and isinstance(reply["raise"], list) and len(reply["raise"]) == 2:
            raise _raised(*reply["raise"])
        raise ProgramGone("unexpected reply from the program under test")

    class Remote:
        """An object of the program's own class (MBPP's ``Node``, ``Pair``), held by the program: attributes
        are read and set over the wire; equality and hashing are by identity, never the program's own."""

        __slots__ = ("_h",)

        def __init__(self, h):
            object.__setattr__(self, "_h", h)

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _rpc({"getattr": [self._h, name]})

        def __setattr__(self, name, value):
            _rpc({"setattr": [self._h, name, to_data(value, 0, _handle)]})

        def __repr__(self):
            return "<object #%d of the program under test>" % self._h

    _remotes = {}

    def _remote(k):
        if k not in _remotes:
            _remotes[k] = Remote(k)
        return _remotes[k]

    def _handle(v):
        return v._h if isinstance(v, Remote) else None

    def _program_class(name):
        def make(*args, **kwargs):
            made = _rpc({"new": [name, to_data(list(args), 0, _handle), to_data(kwargs, 0, _handle)]})
            if not isinstance(made, Remote):
                raise ProgramGone("the program's %s() did not build an object of its own class" % name)
            return made

        make.__name__ = make.__qualname__ = name
        return make

    def candidate(*args, **kwargs):
        return _rpc({"call": [to_data(list(args), 0, _handle), to_data(kwargs, 0, _handle)]})

    def _names(code):
        """Every name the test code's byte code refers to, nested functions included."""
        names = set(code.co_names)
        for const in code.co_consts:
            if hasattr(const, "co_names"):
                names |= _names(const)
        return names

    try:
        hello = recv(resp_fd)
    except WireError as e:
        _verdict(passed=False, reason="the program did not load: %s" % e)
    if hello.get("ready") is not True:
        _verdict(passed=False, reason="the program did not load: %s" % str(hello.get("load_error"))[:500])

    ns = {"__name__": "__loosespec_tests__", "__builtins__": builtins}
    try:
        exec(compile(cfg["prompt"], "<prompt>", "exec"), ns)
    except BaseException:
        _verdict(error="the problem's prompt did not run: " + traceback.format_exc(limit=3)[-1000:])
    ns[entry] = candidate
    try:
        tests = compile(cfg["test"], "<tests>", "exec")
        # a class the tests use but neither they nor the prompt define is the program's own (MBPP 601's Pair):
        # built in the program, through a handle. Only such names: never a builtin, never one the tests define.
        classes = hello.get("classes") if isinstance(hello.get("classes"), list) else []
        for name in [c for c in classes if isinstance(c, str) and c.isidentifier()][:100]:
            if name in _names(tests) and name not in ns and not hasattr(builtins, name):
                ns[name] = _program_class(name)
        exec(tests, ns)
        ns["check"](candidate)
    except BaseException as e:  # SystemExit from the tests included: the tests did not finish
        _verdict(passed=False, reason=("%s: %s" % (type(e).__name__, e))[:1000])
    _verdict(passed=True)
