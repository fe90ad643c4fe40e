#!/usr/bin/env python3
"""A stand-in for ``vllm serve`` speaking the three endpoints the harness uses (/health, /metrics,
/v1/completions), so the vllm-* benchmark plumbing is tested without vLLM. It "generates" the
prompt's ids reversed, and its text says which acceptance rule was selected: ``rule=native-fly`` when
``--speculative-config`` asks for vLLM's own FLy, else the plugin's environment variable.

:func:`write_env` lays out a stand-in vLLM *environment* (``bin/python``, ``bin/vllm`` and a ``vllm`` package
whose ``vllm.config.speculative.SpeculativeConfig`` has vLLM's native FLy fields or not), so that the native-FLy
detection (:mod:`loosespec.integrations.vllm.native`) is asked a real question in another process. Served from
such an environment, the stand-in refuses ``--speculative-config`` keys its ``SpeculativeConfig`` lacks, as
vLLM's pydantic config does."""

import json
import os
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve()


def write_env(root, native: bool, style: str = "dataclass", cpu: bool = False, version: str = "0.99.0+fake") -> str:
    """A stand-in vLLM environment under ``root``; returns its ``bin/vllm``. ``native``: its SpeculativeConfig
    declares FLy (``rejection_sample_method`` may be ``"fly"``, and the ``fly_*`` fields); ``style``: a stdlib
    ``dataclass`` or a pydantic ``model`` (vLLM's is a pydantic dataclass); ``cpu``: its platform is the CPU."""
    root = Path(root)
    pkg = root / "site" / "vllm"
    (pkg / "config").mkdir(parents=True, exist_ok=True)
    (pkg / "platforms").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (pkg / "config" / "__init__.py").write_text("from vllm.config.speculative import SpeculativeConfig\n")
    (pkg / "platforms" / "__init__.py").write_text(
        textwrap.dedent(f"""
        class _Platform:
            def is_cpu(self):
                return {cpu!r}
        current_platform = _Platform()
    """)
    )
    methods = '"standard", "synthetic", "block"' + (', "fly"' if native else "")
    fly_fields = (
        textwrap.dedent("""
        fly_window_size: Optional[int] = None
        fly_entropy_threshold: float = 0.3
        fly_entropy_top_k: int = 3
    """)
        if native
        else ""
    )
    fields = (
        textwrap.dedent("""
        method: Optional[str] = None
        model: Optional[str] = None
        num_speculative_tokens: Optional[int] = None
        prompt_lookup_max: Optional[int] = None
        prompt_lookup_min: Optional[int] = None
        rejection_sample_method: RejectionSampleMethod = "standard"
    """)
        + fly_fields
    )
    if style == "dataclass":
        head = "from dataclasses import dataclass\n\n\n@dataclass\nclass SpeculativeConfig:\n"
    elif style == "model":
        head = "from pydantic import BaseModel\n\n\nclass SpeculativeConfig(BaseModel):\n"
    else:
        raise ValueError(style)
    (pkg / "config" / "speculative.py").write_text(
        "from typing import Literal, Optional\n"
        f"RejectionSampleMethod = Literal[{methods}]\n" + head + textwrap.indent(fields, "    ")
    )
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    python = bin_dir / "python"
    python.write_text(
        f'#!/bin/sh\nPYTHONPATH={root / "site"}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n'
    )
    vllm = bin_dir / "vllm"
    vllm.write_text(f'#!/bin/sh\nexec {python} {HERE} "$@"\n')
    for exe in (python, vllm):
        exe.chmod(0o755)
    return str(vllm)


def _check_spec(spec):
    """Refuse keys the environment's SpeculativeConfig lacks (when there is one), as vLLM's config does."""
    try:
        import dataclasses

        from vllm.config.speculative import SpeculativeConfig
    except ImportError:
        return
    fields = (
        {f.name for f in dataclasses.fields(SpeculativeConfig)}
        if dataclasses.is_dataclass(SpeculativeConfig)
        else set(SpeculativeConfig.model_fields)
    )
    extra = sorted(set(spec) - fields)
    if extra:
        sys.exit(
            f"pydantic_core.ValidationError: 1 validation error for SpeculativeConfig\n{extra[0]}\n"
            "  Extra inputs are not permitted"
        )


def main(args):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    assert args[0] == "serve", args
    port = int(args[args.index("--port") + 1])
    spec = json.loads(args[args.index("--speculative-config") + 1]) if "--speculative-config" in args else None
    if spec is not None:
        _check_spec(spec)
    if spec is not None and spec.get("rejection_sample_method") == "fly":
        rule = "native-fly"
    else:
        rule = os.environ.get("LOOSESPEC_REJECTION_SAMPLE_METHOD", "unset")
    counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code, body, ctype="application/json"):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                return self._send(200, "")
            if self.path == "/metrics":
                lines = []
                for key, name in (
                    ("drafts", "num_drafts"),
                    ("draft_tokens", "num_draft_tokens"),
                    ("accepted", "num_accepted_tokens"),
                ):
                    lines += [
                        f"# TYPE vllm:spec_decode_{name} counter",
                        f'vllm:spec_decode_{name}_total{{model_name="target"}} {float(counters[key])}',
                    ]
                return self._send(200, "\n".join(lines) + "\n", "text/plain")
            self._send(404, "{}")

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if body.get("max_tokens", 0) < 1:
                return self._send(400, json.dumps({"error": {"message": "max_tokens must be at least 1"}}))
            ids = list(reversed(body["prompt"]))[: body["max_tokens"]]
            if spec is not None:
                k = spec["num_speculative_tokens"]
                steps = max(1, len(ids) // 3)
                counters["drafts"] += steps
                counters["draft_tokens"] += steps * k
                counters["accepted"] += len(ids) - steps
            self._send(
                200,
                json.dumps(
                    {
                        "choices": [{"text": f"rule={rule} n={len(ids)}", "token_ids": ids}],
                        "usage": {"completion_tokens": len(ids)},
                    }
                ),
            )

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
