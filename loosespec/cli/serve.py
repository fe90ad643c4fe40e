"""``loosespec serve``: the OpenAI-compatible HTTP server, in this process or as ``vllm serve`` with the plugin."""

from __future__ import annotations

import logging
from typing import List, Optional

import typer

from loosespec.cli.options import (
    apply_speculative_config,
    knob_options,
    knob_values,
    load_options,
    speculative_config_option,
)
from loosespec.cli.root import app
from loosespec.config import VLLM_KNOBS, DecodeConfig
from loosespec.errors import LoosespecError
from loosespec.loading import CACHE_OPTIONS, LoadConfig
from loosespec.methods import METHODS, needs_draft_model

log = logging.getLogger(__name__)


@app.command()
@knob_options(exclude=("max_new_tokens", "stop"))  # requests send max_tokens and stop (OpenAI's fields)
@load_options(exclude=CACHE_OPTIONS)
def serve(
    ctx: typer.Context,
    load: LoadConfig = None,  # --target, --draft, --revision, ..., --device (loosespec.loading)
    host: str = typer.Option(
        "127.0.0.1",
        help="Address to bind; the default answers this machine only. "
        "0.0.0.0 exposes the server to the network (use --api-key).",
    ),
    port: int = typer.Option(8000, help="TCP port."),
    api_key: Optional[str] = typer.Option(
        None,
        envvar="LOOSESPEC_API_KEY",
        help="Require 'Authorization: Bearer KEY' "
        "on /v1/* (/health and /metrics stay open). Also read from $LOOSESPEC_API_KEY.",
    ),
    max_queue: int = typer.Option(64, help="Requests allowed to wait behind the running one; more get 429."),
    max_tokens_default: int = typer.Option(256, help="max_tokens when a request sends none (capped by the context)."),
    allow_origin: Optional[List[str]] = typer.Option(
        None,
        "--allow-origin",
        metavar="ORIGIN",
        help="Origins (http://localhost:3000) or host names (gpu-box.lan) also accepted, "
        "repeatable or comma-separated; '*' accepts any. By default (a guard against DNS rebinding) requests must be "
        "addressed (Host) to localhost, 127.0.0.1, ::1 or --host with this port, and a browser's Origin must be the "
        "server's own: a web page cannot drive a server on loopback. The Host is not checked on 0.0.0.0 / ::. A "
        "listed origin also gets CORS headers.",
    ),
    stall_timeout: float = typer.Option(
        300.0,
        help="Seconds a generation may go without progress (a new token) "
        "before GET /health answers 503 'stalled'; 0 never does.",
    ),
    shutdown_timeout: float = typer.Option(
        20.0,
        help="On shutdown (SIGTERM, Ctrl-C), seconds the running and "
        "waiting requests get to finish; then they are answered 503 and the "
        "process exits.",
    ),
    served_model_name: Optional[str] = typer.Option(
        None, help="Model name clients send and /v1/models lists (default: --target); the target spec is accepted too."
    ),
    log_level: str = typer.Option("info", help="uvicorn log level: critical | error | warning | info | debug"),
    engine_name: str = typer.Option(
        "transformers",
        "--engine",
        help="transformers (this process) | vllm: run "
        "`vllm serve` from vLLM's environment (make vllm) with the loosespec plugin; "
        "ar, exact or fly (LOSSY) with --drafter model or ngram, server-wide.",
    ),
    vllm_bin: str = typer.Option(
        None, help="--engine vllm: the vllm executable (default: .venv-vllm/bin/vllm or $LOOSESPEC_VLLM_BIN)."
    ),
    speculative_config: Optional[str] = speculative_config_option(),
    **knobs,
):
    """Serve the models over an OpenAI-compatible HTTP API (needs pip install 'loosespec[server]').

    Endpoints: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (stream: true for
    server-sent events), GET /health, GET /metrics (Prometheus). The decoding options are
    defaults; each request may choose its own method, drafter, num_draft_tokens, seed and fly_* /
    sg_* parameters (same names as here, e.g. openai's extra_body={"method": "fly"}), or vLLM's
    speculative_config object (the keys --speculative-config takes; its model must be --draft). Methods ar,
    exact and rejection are lossless. fly and specguard are LOSSY: their output differs from the
    target's own, and their responses say "lossy": true in metrics.

    Requests must be addressed to this server (Host: localhost, 127.0.0.1, ::1 or --host) and web
    pages may call it only from origins named by --allow-origin: a guard against DNS rebinding.
    """
    try:
        from loosespec.serve.app import serve as run_server
        from loosespec.serve.protocol import ServerSettings
    except ImportError as e:
        raise LoosespecError(
            f"the server needs its optional dependencies ({e.name or e}): pip install 'loosespec[server]'"
        ) from e
    from loosespec.decode.engine import Engine

    if max_queue < 1:
        raise LoosespecError(f"--max-queue must be >= 1, got {max_queue}")
    if max_tokens_default < 1:
        raise LoosespecError(f"--max-tokens-default must be positive, got {max_tokens_default}")
    if not (0 < port < 65536):
        raise LoosespecError(f"--port must be in 1..65535, got {port}")
    if api_key is not None and not api_key.strip():
        raise LoosespecError("--api-key must not be empty")
    import math

    from loosespec.serve.access import parse_allow_origins

    try:
        allow_origins = parse_allow_origins(allow_origin)
    except ValueError as e:
        raise LoosespecError(str(e)) from None
    if not (stall_timeout >= 0 and math.isfinite(stall_timeout)):
        raise LoosespecError(f"--stall-timeout must be >= 0 seconds (0: never stalled), got {stall_timeout}")
    if not (shutdown_timeout >= 0 and math.isfinite(shutdown_timeout)):
        raise LoosespecError(f"--shutdown-timeout must be >= 0 seconds, got {shutdown_timeout}")
    if engine_name == "vllm" and allow_origins:
        raise LoosespecError(
            "--allow-origin is not passed to vLLM (vllm serve checks no Host header): use "
            "--engine transformers, or vllm's own --allowed-origins"
        )
    target = load.target
    draft_spec = load.draft_model
    defaults = knob_values(knobs)
    if speculative_config is not None:  # vLLM's spelling (loosespec.speculative_config): the defaults and --draft
        defaults, load = apply_speculative_config(ctx, speculative_config, defaults, load)
        draft_spec = load.draft_model
    method = defaults.get("method")  # None: per request, exact when greedy, rejection when sampling
    if engine_name == "vllm":
        if load.revision or load.draft_revision:
            raise LoosespecError(
                "--revision/--draft-revision are not passed to vLLM: serve a local copy of the "
                "revision, or use --engine transformers"
            )
        return _serve_vllm(
            target,
            draft_spec,
            method,
            defaults.get("drafter"),
            defaults.get("num_draft_tokens"),
            load.dtype,
            {n: defaults.get(n) for n in VLLM_KNOBS},
            host,
            port,
            api_key,
            served_model_name or target,
            vllm_bin,
        )
    if engine_name != "transformers":
        raise LoosespecError(f"--engine must be transformers or vllm, got {engine_name!r}")
    # fail on bad defaults before loading anything
    cfg = DecodeConfig.create(**defaults, has_draft_model=draft_spec is not None)
    if draft_spec is None and needs_draft_model(cfg.method, cfg.drafter):
        raise LoosespecError(
            f"default method '{cfg.method}' with drafter '{cfg.drafter}' needs a draft model: pass --draft"
        )
    engine = Engine.load_from(load, torch_draft=METHODS[cfg.method].torch_draft)
    name = served_model_name or target
    settings = ServerSettings(
        served_model_name=name,
        aliases=(target,),
        defaults=defaults,
        api_key=api_key,
        max_queue=max_queue,
        max_tokens_default=max_tokens_default,
        host=host,
        allow_origins=allow_origins,
        stall_timeout_s=stall_timeout,
        shutdown_timeout_s=shutdown_timeout,
    )
    label = cfg.method if cfg.drafter is None else f"{cfg.method}-{cfg.drafter}"
    label += "" if method else "; a request naming no method: exact when greedy, rejection when sampling"
    log.info(
        f"loosespec: serving {name} (draft: {draft_spec or 'none'}; default method {label}"
        f"{', LOSSY' if cfg.lossy else ''}) on http://{host}:{port}/v1"
        f"{' (API key required)' if api_key else ''}"
    )
    run_server(engine, settings, host=host, port=port, log_level=log_level)


def vllm_dtype(dtype: str) -> str:
    """vLLM's dtype for ours: vLLM has no int8 path of loosespec's, and its own "auto" would read the
    float32 the embedded models are stored in, so auto means bfloat16 there (what vLLM serves them in)."""
    return "bfloat16" if dtype == "auto" else dtype


def _serve_vllm(
    target,
    draft_spec,
    method,
    drafter,
    num_draft_tokens,
    dtype,
    fly: dict,
    host,
    port,
    api_key,
    served_model_name,
    vllm_bin,
) -> None:
    """Replace this process by ``vllm serve`` with the loosespec plugin configured (the same OpenAI API)."""
    import os

    from loosespec.eval.peers.vllm import DEFAULT_VLLM, VllmSettings, method_for, needs_draft, server_command
    from loosespec.models import resolve

    spec = METHODS.get(method)  # an unknown name: DecodeConfig.create says so
    if drafter is None and (spec is None or spec.speculative):  # vLLM's proposers: a draft model, else prompt lookup
        drafter = "model" if draft_spec is not None else "ngram"  # (no MLA)
    cfg = DecodeConfig.create(method, drafter, num_draft_tokens, has_draft_model=draft_spec is not None, **fly)
    vm = method_for(cfg.method, cfg.drafter)
    if needs_draft(vm) and draft_spec is None:
        raise LoosespecError(f"method {cfg.method} with drafter model needs a draft model: pass --draft")
    exe = vllm_bin or DEFAULT_VLLM
    if not os.path.exists(exe):
        raise LoosespecError(f"vLLM not found at {exe}: run `make vllm` or pass --vllm-bin")
    settings = VllmSettings(
        target=str(resolve(target).path),
        draft=str(resolve(draft_spec).path) if needs_draft(vm) else None,
        dtype=vllm_dtype(dtype),
        num_speculative_tokens=num_draft_tokens,  # None: k's default
        vllm_bin=exe,
        fly=fly,
    )
    argv, env = server_command(vm, settings, port, host=host, served_model_name=served_model_name, api_key=api_key)
    log.info(f"loosespec: {vm}{' (LOSSY)' if cfg.lossy else ''} via {' '.join(argv[:3])} ...")
    os.execve(argv[0], argv, {**os.environ, **env})
