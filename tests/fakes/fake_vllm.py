#!/usr/bin/env python3
"""A stand-in for ``vllm serve`` speaking the three endpoints the harness uses (/health, /metrics,
/v1/completions), so the vllm-* benchmark plumbing is tested without vLLM. It "generates" the
prompt's ids reversed, and its text says which acceptance rule the environment selected."""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
assert args[0] == "serve", args
port = int(args[args.index("--port") + 1])
spec = json.loads(args[args.index("--speculative-config") + 1]) if "--speculative-config" in args else None
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
            for key, name in (("drafts", "num_drafts"), ("draft_tokens", "num_draft_tokens"),
                              ("accepted", "num_accepted_tokens")):
                lines += [f"# TYPE vllm:spec_decode_{name} counter",
                          f'vllm:spec_decode_{name}_total{{model_name="target"}} {float(counters[key])}']
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
        self._send(200, json.dumps({"choices": [{"text": f"rule={rule} n={len(ids)}", "token_ids": ids}],
                                    "usage": {"completion_tokens": len(ids)}}))


ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
