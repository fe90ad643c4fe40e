"""Which isolation the sandbox gets here: the probe checks the isolation itself, not reachability; the
bootstrap it runs is a real module; "auto" refuses to run without isolation unless "none" is asked for by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from loosespec.eval import sandbox_probe
from loosespec.eval.sandbox import run_python


def _needs_network_namespace():
    if sandbox_probe.detect().mode not in ("full", "net"):
        pytest.skip("no network namespace here; only the Python-level guard blocks sockets")


def test_probe_checks_isolation_not_reachability(monkeypatch):
    """The mode probe accepts a network namespace only if it is not this process's and has only ``lo``;
    without ``--net`` (the same namespace: on an offline host every public address is unreachable too)
    it reports no network isolation."""
    _needs_network_namespace()
    env = sandbox_probe.detect()
    assert sandbox_probe._probe(env.mode, env.unshare)["net"] is True
    real = sandbox_probe.ns_prefix
    monkeypatch.setattr(
        sandbox_probe,
        "ns_prefix",
        lambda mode, unshare, network: [a for a in real(mode, unshare, network) if a != "--net"],
    )
    assert sandbox_probe._probe(env.mode, env.unshare)["net"] is False


def test_boot_is_a_real_module_that_does_nothing_on_import():
    """The bootstrap is a module linters and tests see (not a string spliced together); importing it runs nothing."""
    import importlib

    boot = importlib.import_module("loosespec.eval.sandbox_boot")
    assert not hasattr(boot, "_cfg")  # the guard and limits run only as __main__, in the child
    assert sandbox_probe.boot_source() == Path(boot.__file__).read_text(encoding="utf-8")
    assert "_real_setrlimit = _resource_mod.setrlimit" in sandbox_probe.boot_source()


# ------------------------------------------------------------------------ modes (issue 43, item 2)


def test_auto_refuses_no_isolation(monkeypatch):
    """Where namespaces are unavailable, "auto" no longer drops to "none" silently: it refuses, naming the way
    to ask for it; "none" by name runs, and the result says which mode ran."""
    from loosespec.errors import LoosespecError

    monkeypatch.delenv("LOOSESPEC_SANDBOX", raising=False)
    monkeypatch.setattr(sandbox_probe, "detect", lambda: sandbox_probe.Env("none", None, False))
    with pytest.raises(LoosespecError, match="--sandbox none"):
        run_python("print(1)\n")
    with pytest.raises(LoosespecError, match="not available"):
        run_python("print(1)\n", mode="full")
    r = run_python("print(1)\n", mode="none")
    assert r.passed and r.mode == "none"
    monkeypatch.setenv("LOOSESPEC_SANDBOX", "none")
    assert run_python("print(1)\n").mode == "none"
    with pytest.raises(LoosespecError, match="unknown sandbox mode"):
        sandbox_probe.resolve_mode("chroot")
