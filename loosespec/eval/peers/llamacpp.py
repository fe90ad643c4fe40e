"""llama.cpp as a benchmark peer: what a CPU user runs instead of transformers.

``llamacpp-ar`` (plain decoding) and ``llamacpp-pld`` (llama-cpp-python's prompt-lookup decoding,
``LlamaPromptLookupDecoding(num_pred_tokens=10)``) run the target's own GGUF file (the embedded
model's assembled GGUF, or a ``.gguf`` target) on the same prompt token ids loosespec's methods
get (chat template applied by the same tokenizer: the GGUF carries the same vocabulary), greedy,
with the same token budget and end tokens, on as many threads as torch uses.

Needs ``llama-cpp-python``, which builds from source (10-20 minutes on 2 cores): ``make peers`` or
``pip install 'loosespec[peers]'``. Never part of ``make test``.
"""

from __future__ import annotations

import time
from pathlib import Path

from loosespec.errors import LoosespecError

LLAMACPP_METHODS = {"llamacpp-ar": None, "llamacpp-pld": 10}  # method -> prompt-lookup tokens per step
MIN_CONTEXT = 2048


def gguf_file(spec: str) -> Path:
    """The GGUF file behind a model spec (an embedded model's assembled file, or a ``.gguf`` path)."""
    from loosespec.models import gguf_path

    path = gguf_path(spec)
    if path is None:
        raise LoosespecError(
            f"llamacpp-* methods run a GGUF file: the target '{spec}' is neither an embedded model nor a .gguf file"
        )
    if not path.is_file():
        raise LoosespecError(f"GGUF file of '{spec}' not found at {path}: run `loosespec models pull {spec}`")
    return path


def _import():
    try:
        import llama_cpp
    except ImportError as e:
        raise LoosespecError(
            "llamacpp-* methods need llama-cpp-python (builds from source, 10-20 min): "
            "make peers, or pip install 'loosespec[peers]'"
        ) from e
    return llama_cpp


class LlamaCppPeer:
    """One loaded llama.cpp model per method (prompt lookup is a constructor argument)."""

    def __init__(self, spec: str, threads: int):
        self.path = gguf_file(spec)
        self.threads = threads
        self._models: dict[str, object] = {}

    def model(self, method: str, tokens: int):
        """The method's llama.cpp model with a context of at least ``tokens`` (re-created when it has less).

        The binding's prompt lookup needs ``logits_all=True``, which keeps a float32 row of logits per
        context position (151,936 wide for Qwen2.5: 0.6 GB per 1,000 positions), so the context is
        sized to the run, not set to the model's maximum."""
        have = self._models.get(method)
        if have is not None and have.n_ctx() >= tokens:
            return have
        self._models.pop(method, None)
        llama_cpp = _import()
        lookup = LLAMACPP_METHODS[method]
        draft = None
        if lookup is not None:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup)
        n_ctx = max(MIN_CONTEXT, 1 << (tokens - 1).bit_length())
        self._models[method] = llama_cpp.Llama(
            model_path=str(self.path),
            n_ctx=n_ctx,
            n_threads=self.threads,
            n_threads_batch=self.threads,
            draft_model=draft,
            logits_all=draft is not None,
            verbose=False,
        )
        return self._models[method]

    def generate(self, method: str, ids: list[int], max_new_tokens: int, stop_ids) -> tuple[list[int], float]:
        """Greedy continuation of ``ids``: (new token ids, wall seconds including the prefill)."""
        llm = self.model(method, len(ids) + max_new_tokens + 16)
        llm.reset()  # no prompt cache carried over between runs: every run pays its prefill
        stops = set(stop_ids) | {llm.token_eos()}
        new: list[int] = []
        t = time.perf_counter()
        for tok in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            new.append(int(tok))
            if tok in stops or len(new) >= max_new_tokens:
                break
        return new, time.perf_counter() - t


# ---------------------------------------------------------------------------------------------
# llamacpp-spec: llama.cpp's own speculative decoding, as its server runs it
# ---------------------------------------------------------------------------------------------

SERVER_METHODS = ("llamacpp-spec",)  # the target's GGUF with the draft's GGUF as llama.cpp's draft model
SERVER_ENV = "LOOSESPEC_LLAMA_SERVER"
SERVER_START_S = 300  # loading two models on two cores takes seconds; a build missing a feature fails at once


def server_binary() -> Path:
    """``llama-server``: ``$LOOSESPEC_LLAMA_SERVER``, else the one ``make peers`` builds into the virtual environment
    (``.venv/llama.cpp/bin``), else the one on ``PATH``."""
    import os
    import shutil
    import sys

    candidates = [
        os.environ.get(SERVER_ENV),
        str(Path(sys.prefix) / "llama.cpp" / "bin" / "llama-server"),
        shutil.which("llama-server"),
    ]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    raise LoosespecError(
        "llamacpp-spec runs llama.cpp's own server (llama-server), which was not found: make peers "
        f"builds it from llama-cpp-python's sources into .venv/llama.cpp/bin, or set {SERVER_ENV}"
    )


class LlamaServerPeer:
    """One ``llama-server`` process with the target and the draft model (``-md``), speculative type draft-simple,
    every other speculative setting at llama.cpp's default; started on first use on a free local port, stopped by
    :meth:`close` (and at exit). Greedy, the same prompt ids, budget and end tokens as the other methods; the prompt
    cache is off so every request pays its prefill, as every other method does."""

    def __init__(self, target: str, draft: str, threads: int, n_ctx: int = 8192):
        self.target, self.draft = gguf_file(target), gguf_file(draft)
        self.threads, self.n_ctx = threads, n_ctx
        self.binary = server_binary()
        self.proc = None
        self.url = None
        self.args: list[str] = []

    def start(self) -> None:
        import atexit
        import socket
        import subprocess
        import tempfile
        import time
        import urllib.request

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.args = [
            "-m",
            str(self.target),
            "-md",
            str(self.draft),
            "--spec-type",
            "draft-simple",
            "-t",
            str(self.threads),
            "-tb",
            str(self.threads),
            "-c",
            str(self.n_ctx),
            "-np",
            "1",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([str(self.binary), *self.args], stdout=self._log, stderr=subprocess.STDOUT)
        atexit.register(self.close)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._log.seek(0)
                tail = self._log.read().decode(errors="replace").strip().splitlines()[-3:]
                raise LoosespecError(f"llama-server exited with code {self.proc.returncode}: {' | '.join(tail)}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.close()
        raise LoosespecError(f"llama-server did not answer /health within {SERVER_START_S} s")

    def generate(self, ids: list[int], max_new_tokens: int, stop_ids) -> tuple[list[int], float, dict]:
        """Greedy continuation of ``ids``: (new token ids, wall seconds including the prefill, llama.cpp's timings
        with its draft counters)."""
        import json
        import time
        import urllib.request

        if self.proc is None:
            self.start()
        body = {
            "prompt": list(ids),
            "n_predict": max_new_tokens,
            "temperature": 0.0,
            "top_k": 1,
            "cache_prompt": False,
            "return_tokens": True,
            "stream": False,
        }
        req = urllib.request.Request(
            self.url + "/completion", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        t = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=3600) as r:
                out = json.loads(r.read())
        except OSError as e:
            raise LoosespecError(f"llama-server request failed: {e}") from e
        wall = time.perf_counter() - t
        new = [int(x) for x in out.get("tokens", [])]
        stops = set(stop_ids)
        end = next((i for i, tok in enumerate(new) if tok in stops), None)
        if end is not None:  # llama.cpp stops at its end-of-generation tokens; ours may be more
            new = new[: end + 1]
        return new, wall, out.get("timings", {})

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
        self.proc = None
