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
    from loosespec.models import EMBEDDED, _gguf_path

    if spec in EMBEDDED:
        path = _gguf_path(spec)
    elif spec.endswith(".gguf"):
        path = Path(spec).expanduser()
    else:
        raise LoosespecError(f"llamacpp-* methods run a GGUF file: the target '{spec}' is neither an embedded "
                             "model nor a .gguf file")
    if not path.is_file():
        raise LoosespecError(f"GGUF file of '{spec}' not found at {path}: run `loosespec models pull {spec}`")
    return path


def _import():
    try:
        import llama_cpp
    except ImportError as e:
        raise LoosespecError("llamacpp-* methods need llama-cpp-python (builds from source, 10-20 min): "
                             "make peers, or pip install 'loosespec[peers]'") from e
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
        self._models[method] = llama_cpp.Llama(model_path=str(self.path), n_ctx=n_ctx, n_threads=self.threads,
                                               n_threads_batch=self.threads, draft_model=draft,
                                               logits_all=draft is not None, verbose=False)
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
