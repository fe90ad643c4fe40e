"""The ``vllm.general_plugins`` entry point: FLy as vLLM's acceptance rule (LOSSY when enabled).

vLLM runs every general plugin in each of its processes before the model runner is built. With
``LOOSESPEC_REJECTION_SAMPLE_METHOD=fly`` this one replaces the module-level ``rejection_sample``
of ``vllm.v1.sample.rejection_sampler`` (called by the V1 runner's ``RejectionSampler.forward``, the
runner vLLM uses on CPU) by :func:`loosespec.integrations.vllm.rule.fly_rejection_sample`, and wraps
``apply_sampling_constraints`` to keep a copy of the raw logits for FLy's entropy gate (vLLM
divides sampled requests' logits by their temperature in place before verification). Without the
variable the plugin does nothing, so installing loosespec into a vLLM environment changes nothing. On a vLLM
that has FLy natively (its ``SpeculativeConfig`` declares ``fly_window_size``, ``fly_entropy_threshold`` and
``fly_entropy_top_k``: vLLM 0.33.0 and later) it refuses to patch, with a log line: vLLM's own FLy is asked for
in ``speculative_config`` (:mod:`loosespec.integrations.vllm.native`), unless ``LOOSESPEC_VLLM_FLY_PATH=plugin``.

On GPUs vLLM's default V2 model runner (``vllm/v1/worker/gpu/spec_decode``) verifies with its own
fused kernel and another layout; the plugin wraps its ``RejectionSampler._verify`` (which holds the raw
logits before processing) and rules through :func:`loosespec.integrations.vllm.rule.fly_rejection_sample_v2`, a
re-layout onto the same function. ``_verify``'s arguments are bound by name, so vLLM releases whose
``_verify`` takes 10 or 11 parameters both work; a sampler whose ``__call__`` never reaches ``_verify`` (a
CUDA-graphed fast path) is refused by :func:`register`, and a step that bypasses it at run time raises. That
path is tested on hand-built V2-shaped tensors and against the installed class's signature, not on a GPU
(none was available to this project).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import inspect
import json
import logging
import math
import os
import threading
import time

import torch

from loosespec.integrations.vllm.rule import COUNTERS, FlySettings, fly_rejection_sample, fly_rejection_sample_v2

log = logging.getLogger("loosespec.integrations.vllm")
_STATE = threading.local()  # the raw logits of the batch being verified (one model runner per process)


STATS_WRITE_INTERVAL_S = 0.5  # the stats file is rewritten at most this often


def _start_timer(delay: float, fn) -> None:
    """Run ``fn`` in ``delay`` seconds on a daemon thread (the stats file's trailing write)."""
    timer = threading.Timer(delay, fn)
    timer.daemon = True
    timer.start()


class FlyCounters:
    """FLy's counters summed over this process's verification steps, with vLLM's own step counts;
    optionally written to ``LOOSESPEC_FLY_STATS_FILE`` (per process: ``{pid}`` in the path is replaced).

    The file is rewritten at most every :data:`STATS_WRITE_INTERVAL_S` seconds: a step inside the interval
    schedules one trailing write at its end (so the file is never more than an interval behind), and the process
    writes it once more at exit. Statistics never stop generation: :meth:`add` runs inside vLLM's sampler, so a
    failure to count or to write (a full disk, a directory that cannot be written) is logged once and swallowed."""

    def __init__(self, path: str | None):
        self.values = dict.fromkeys(("steps", "requests", "drafted_tokens", "accepted_tokens", *COUNTERS), 0)
        self.path = path.replace("{pid}", str(os.getpid())) if path else None
        self._last_write = -math.inf  # time.monotonic() of the last write (attempted)
        self._pending = False  # a trailing write is scheduled
        self._lock = threading.Lock()  # the values and the schedule
        self._write_lock = threading.Lock()  # one writer of the file at a time (the sampler, the timer, atexit)
        self._failed: set[str] = set()  # what has failed and been logged once: "count", "write"
        if self.path:  # the last steps' counts too, when the process ends normally
            atexit.register(self.write)

    def add(self, out: torch.Tensor, num_draft_tokens, events: dict[str, int]) -> None:
        try:
            drafted = int(num_draft_tokens.sum() if torch.is_tensor(num_draft_tokens) else sum(num_draft_tokens))
            accepted = int(((out >= 0).sum(-1) - 1).clamp(min=0).sum())
            with self._lock:
                v = self.values
                v["steps"] += 1
                v["requests"] += len(num_draft_tokens)
                v["drafted_tokens"] += drafted
                v["accepted_tokens"] += accepted
                for name, n in events.items():
                    v[name] = v.get(name, 0) + n
        except Exception:  # noqa: BLE001 - counting must never stop vLLM's sampler
            self._log_once(
                "count",
                "loosespec: FLy's counters could not be updated (statistics only; generation goes on)",
                exc_info=True,
            )
            return
        self._maybe_write()

    def _maybe_write(self) -> None:
        if not self.path:
            return
        with self._lock:
            wait = self._last_write + STATS_WRITE_INTERVAL_S - time.monotonic()
            if wait > 0:
                if self._pending:
                    return
                self._pending = True
        if wait > 0:
            try:
                _start_timer(wait, self._trailing_write)
            except Exception:  # noqa: BLE001 - e.g. no thread can be started: the next step or exit writes
                with self._lock:
                    self._pending = False
            return
        self.write()

    def _trailing_write(self) -> None:
        with self._lock:
            self._pending = False
        self.write()

    def write(self) -> None:
        """Write the counters now (to a temporary file, then renamed); a failure is logged once, never raised."""
        if not self.path:
            return
        with self._write_lock:
            with self._lock:
                snapshot = dict(self.values)
                self._last_write = time.monotonic()
            tmp = f"{self.path}.{os.getpid()}.tmp"
            try:
                with open(tmp, "w") as f:
                    json.dump(snapshot, f)
                os.replace(tmp, self.path)
            except Exception as e:  # noqa: BLE001 - statistics must never stop generation
                self._log_once(
                    "write",
                    f"loosespec: cannot write FLy's counters to {self.path} ({type(e).__name__}: "
                    f"{e}); generation goes on without the stats file (logged once)",
                )
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def _log_once(self, what: str, message: str, **kw) -> None:
        if what not in self._failed:
            self._failed.add(what)
            log.warning(message, **kw)


def register() -> None:
    """Entry point (``vllm.general_plugins``): patch vLLM's verification when FLy is enabled, unless this vLLM
    has FLy natively (:func:`loosespec.integrations.vllm.native.native_fly_in_process`): then it refuses, with a
    log line saying how to ask vLLM for it, unless ``LOOSESPEC_VLLM_FLY_PATH=plugin`` insists."""
    settings = FlySettings.from_env()
    if settings is None:
        return
    sampled_path = v2_sampled_path()  # a bad value refused before anything is patched
    if refuse_for_native_fly(settings):
        return
    import vllm.v1.sample.rejection_sampler as rs

    if getattr(rs.rejection_sample, "_loosespec", False):  # already patched in this process
        return
    counters = FlyCounters(os.environ.get("LOOSESPEC_FLY_STATS_FILE"))
    _patch_v2_runner(settings, counters, sampled_path)
    original_constraints = rs.apply_sampling_constraints
    greedy_temperature = getattr(rs.GREEDY_TEMPERATURE, "value", rs.GREEDY_TEMPERATURE)

    def apply_sampling_constraints(logits, cu_num_draft_tokens, sampling_metadata):
        # vLLM scales sampled requests' logits in place; FLy's gate reads the raw ones
        _STATE.raw = None if sampling_metadata.all_greedy else logits.clone()
        return original_constraints(logits, cu_num_draft_tokens, sampling_metadata)

    def rejection_sample(
        draft_token_ids,
        num_draft_tokens,
        max_spec_len,
        cu_num_draft_tokens,
        draft_probs,
        target_logits,
        bonus_token_ids,
        sampling_metadata,
        *args,
        **kwargs,
    ):
        if kwargs.get("synthetic_mode"):
            raise RuntimeError("loosespec FLy and vLLM's synthetic rejection sampling cannot be combined")
        raw = getattr(_STATE, "raw", None)
        _STATE.raw = None
        is_greedy = uniform = None
        if not sampling_metadata.all_greedy:
            is_greedy = sampling_metadata.temperature == greedy_temperature
            uniform = rs.generate_uniform_probs(
                draft_token_ids.shape[0], num_draft_tokens, sampling_metadata.generators, target_logits.device
            )
        out, events = fly_rejection_sample(
            draft_token_ids,
            num_draft_tokens,
            max_spec_len,
            cu_num_draft_tokens,
            draft_probs,
            target_logits,
            bonus_token_ids,
            is_greedy,
            settings,
            raw_logits=raw,
            uniform_probs=uniform,
            generators=sampling_metadata.generators,
        )
        counters.add(out, num_draft_tokens, events)
        return out

    rejection_sample._loosespec = True
    rs.apply_sampling_constraints = apply_sampling_constraints
    rs.rejection_sample = rejection_sample
    log.warning(
        "loosespec: FLy (LOSSY) verifies vLLM's drafts: window %s positions after a mismatch, entropy "
        "threshold %s, top-%d, boundary %s (unset: vLLM's native defaults)",
        settings.fly_window_size,
        settings.fly_entropy_threshold,
        settings.fly_entropy_top_k,
        settings.fly_boundary,
    )


def refuse_for_native_fly(settings: FlySettings) -> bool:
    """True (and a warning) when this vLLM verifies with FLy natively and the plugin is not insisted on: vLLM's
    own FLy is then the one to use, asked for in ``speculative_config`` (what ``loosespec serve --engine vllm`` and
    ``bench`` pass there), and wrapping its private sampler would fight it."""
    from loosespec.integrations.vllm.native import (
        FLY_PATH_ENV,
        native_fly_config,
        native_fly_in_process,
        requested_path,
    )

    native, found = native_fly_in_process()
    if not native or requested_path() == "plugin":
        return False
    values = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
    try:
        example = json.dumps(native_fly_config({**values, "fly_boundary": None}, 15))
    except ValueError as e:
        example = f'{{"rejection_sample_method": "fly", ...}} ({e})'
    log.warning(
        "loosespec: this vLLM has FLy natively (%s); the loosespec plugin does not patch it. Ask vLLM for "
        "it in --speculative-config, e.g. %s merged into the proposer's settings (loosespec serve --engine "
        "vllm and bench do); set %s=plugin to patch anyway",
        found,
        example,
        FLY_PATH_ENV,
    )
    return True


# what the wrapper reads from vLLM's V2 ``RejectionSampler._verify``, by parameter name (its positional order and
# count differ between vLLM releases: 10 parameters in some, 11 with ``verify_draft_sampled`` in others)
V2_VERIFY_REQUIRED = ("logits", "draft_sampled", "pos", "cu_num_logits", "idx_mapping")
# a name ``Sampler.apply_sampling_params`` may use for a value ``_verify`` holds under another name
V2_ALIASES = {"input_ids": "draft_sampled"}


class V2Unsupported(RuntimeError):
    """vLLM's V2 rejection sampler has a shape this plugin cannot wrap without turning FLy off silently."""


def _code_names(code) -> set[str]:
    """Global and attribute names a code object uses, nested functions and comprehensions included."""
    out = set(code.co_names)
    for c in code.co_consts:
        if inspect.iscode(c):
            out |= _code_names(c)
    return out


def _reachable_names(cls, start: str, depth: int = 4) -> set[str]:
    """Names the method ``start`` of ``cls`` uses, following the class's own methods ``depth`` calls deep (what
    ``self.<name>(...)`` can reach, read from the code objects: nothing is run)."""
    names: set[str] = set()
    visited: set[str] = set()
    frontier = [start]
    for _ in range(depth + 1):
        following = []
        for m in frontier:
            if m in visited:
                continue
            visited.add(m)
            fn = inspect.getattr_static(cls, m, None)
            code = getattr(getattr(fn, "__func__", fn), "__code__", None)
            if code is None:
                continue
            for n in _code_names(code):
                names.add(n)
                following.append(n)
        frontier = following
    return names


def check_v2_sampler(sampler_cls) -> inspect.Signature:
    """Refuse (:class:`V2Unsupported`) a V2 ``RejectionSampler`` the wrapper cannot serve: a ``_verify`` without
    the parameters it reads by name, or a ``__call__`` that never reaches ``_verify`` (a CUDA-graphed fast path
    that would verify with vLLM's own kernel and leave FLy off without a word). Returns ``_verify``'s signature."""
    sig = inspect.signature(sampler_cls._verify)
    missing = [n for n in V2_VERIFY_REQUIRED if n not in sig.parameters]
    if missing:
        raise V2Unsupported(
            f"loosespec FLy: this vLLM's V2 RejectionSampler._verify{sig} lacks {missing}; the "
            "plugin reads its arguments by these names and cannot verify with FLy here"
        )
    if any("__call__" in vars(b) for b in sampler_cls.__mro__[:-1]):
        reach = _reachable_names(sampler_cls, "__call__")
        if "_verify" not in reach:
            graphed = sorted(n for n in reach if "graph" in n.lower())
            raise V2Unsupported(
                "loosespec FLy: this vLLM's V2 RejectionSampler.__call__ never calls _verify"
                + (f" (it goes through {', '.join(graphed)}: a CUDA-graphed sampler)" if graphed else "")
                + "; FLy would be silently off. Use a vLLM whose V2 sampler verifies through _verify, disable its "
                "graphed sampler, or unset LOOSESPEC_REJECTION_SAMPLE_METHOD"
            )
    return sig


def _call_by_name(fn, values: dict):
    """``fn`` with each of its parameters taken from ``values`` by name (or an alias in :data:`V2_ALIASES`);
    parameters with defaults that ``values`` lacks keep their defaults."""
    kwargs = {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        key = p.name if p.name in values else V2_ALIASES.get(p.name)
        if key in values:
            kwargs[p.name] = values[key]
        elif p.default is p.empty:
            raise V2Unsupported(
                f"loosespec FLy: {getattr(fn, '__qualname__', fn)}{inspect.signature(fn)} needs "
                f"'{p.name}', which this vLLM's _verify does not pass"
            )
    return fn(**kwargs)


def v2_sampled_path(environ=os.environ) -> str:
    """``LOOSESPEC_V2_SAMPLED_PATH``: how the V2 runner's batches with sampled requests are ruled, ``per-request``
    (the default) or ``padded`` (no per-request loop; counter-based draws, equal in distribution:
    :func:`loosespec.integrations.vllm.rule.fly_rejection_sample_v2`)."""
    value = environ.get("LOOSESPEC_V2_SAMPLED_PATH", "").strip().lower() or "per-request"
    if value not in ("per-request", "padded"):
        raise ValueError(f"LOOSESPEC_V2_SAMPLED_PATH must be 'per-request' or 'padded', got {value!r}")
    return value


def _patch_v2_runner(settings: FlySettings, counters: FlyCounters, sampled_path: str = "per-request") -> None:
    """FLy in the V2 model runner (vLLM's default on GPUs): wrap ``RejectionSampler._verify``, which holds
    the raw logits (FLy's gate reads them) before ``apply_sampling_params`` processes them, and rule through
    :func:`loosespec.integrations.vllm.rule.fly_rejection_sample_v2` instead of the fused kernel.

    ``_verify``'s arguments are bound by name (:func:`inspect.signature`), so releases that add, drop or reorder
    its parameters still work; one whose ``__call__`` bypasses ``_verify`` (a CUDA-graphed path) is refused here,
    and a call that bypasses it at run time raises at the first step instead of running without FLy."""
    try:
        import vllm.v1.worker.gpu.spec_decode.rejection_sampler as v2
    except Exception as exc:  # no V2 runner in this vLLM build (or it cannot import here, e.g. without Triton)
        log.info("loosespec: vLLM's V2 runner is not importable here (%s); FLy covers the V1 runner", exc)
        return
    sampler_cls = getattr(v2, "RejectionSampler", None)
    if sampler_cls is None or not hasattr(sampler_cls, "_verify") or getattr(sampler_cls._verify, "_loosespec", False):
        return
    signature = check_v2_sampler(sampler_cls)
    original_call = sampler_cls.__call__ if any("__call__" in vars(b) for b in sampler_cls.__mro__[:-1]) else None

    @functools.wraps(sampler_cls._verify)
    def _verify(self, *args, **kwargs):
        a = signature.bind(self, *args, **kwargs).arguments
        if getattr(self, "synthetic_conditional_rates", None) is not None or getattr(
            self, "use_block_verification", False
        ):
            raise RuntimeError(
                "loosespec FLy replaces vLLM's rejection_sample_method; it cannot be combined "
                "with 'synthetic' or 'block' verification"
            )
        if getattr(self, "watermark_key", None) is not None:
            raise RuntimeError("loosespec FLy cannot be combined with vLLM's watermarking sampler")
        _STATE.v2_verified = True
        logits, cu_num_logits = a["logits"], a["cu_num_logits"]
        processed = _call_by_name(self.sampler.apply_sampling_params, a)
        states = self.sampler.sampling_states
        verify_sampled = a.get("verify_draft_sampled")
        sampled, num_sampled, events = fly_rejection_sample_v2(
            processed,
            logits,
            a.get("draft_logits"),
            a["draft_sampled"] if verify_sampled is None else verify_sampled,
            cu_num_logits,
            a["pos"],
            a["idx_mapping"],
            states.temperature.gpu,
            states.seeds.gpu,
            self.num_speculative_steps,
            settings,
            sampled_path=sampled_path,
        )
        counters.add(sampled, cu_num_logits[1:] - cu_num_logits[:-1] - 1, events)  # sampled is -1 past num_sampled
        return processed, sampled, num_sampled

    _verify._loosespec = True
    sampler_cls._verify = _verify
    if original_call is not None:

        @functools.wraps(original_call)
        def __call__(self, *args, **kwargs):
            _STATE.v2_verified = False
            out = original_call(self, *args, **kwargs)
            if not getattr(_STATE, "v2_verified", False):
                raise V2Unsupported(
                    "loosespec FLy: vLLM's V2 rejection sampler verified a batch without calling "
                    "_verify (a CUDA-graphed or other fast path); FLy would be silently off. "
                    "Disable that path or unset LOOSESPEC_REJECTION_SAMPLE_METHOD"
                )
            return out

        sampler_cls.__call__ = __call__
