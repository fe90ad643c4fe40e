"""A forward run by llama.cpp on the model's own GGUF weights (``--quantize int4``), behind the same
interface as :class:`~loosespec.decode.kv.CachedLM`.

Decoding one token reads every weight once, so on a CPU the bytes per weight decide ``ar``'s speed
(issue 42): the embedded models ship as Q4_K_M GGUF files (about 4.9 bits per weight, with some
tensors in 6 bits), which llama.cpp runs directly, where the int8 path reads 8 bits per weight.

llama.cpp's low-level API gives what speculative decoding needs: one ``llama_decode`` over a batch
returns logits for every position that asks for them (a verify forward's K + 1 rows), and
``llama_memory_seq_rm`` drops KV positions by range (the rollback after a rejected draft). The cache is
kept, as in :class:`~loosespec.decode.kv.CachedLM`, as a memo of the ids it was computed on: every
forward rolls it back to the common prefix of those ids and the sequence asked for, and feeds the rest.

Lossless methods stay lossless only if a row's logits do not depend on how many rows the forward
carried (``exact`` verifies K + 1 rows where ``ar`` feeds one). llama.cpp does not promise that (its
server's documentation: logits "are not guaranteed to be bit-for-bit identical for different batch
sizes"), and with its defaults it is not: ``benchmarks/forward_cost.py --llamacpp-variants`` found no row of
a 16-row forward bit-equal to the one-token forward at the same position. Three of llama.cpp's CPU paths
take a batch another way than a single row, each found by switching it off and measuring:

- repacked weight layouts (its "extra buffer types") run a gemm over each group of 4 rows and a gemv for the
  rows left over (fewer than 4), one row at a time;
- the tiled K-quant matmul, from 8 rows on, unpacks the weights into tiles, where one row runs ``vec_dot``;
- attention: without flash attention the K.Q product goes to llamafile's sgemm from 2 rows on; flash
  attention with an f16 or f32 cache splits a single query's keys across threads once the cache holds 512
  positions.

So this forward keeps llama.cpp's repacked weights (:data:`REPACK`: their gemv is llama.cpp's fastest one-token
path) but asks for logits only in forwards of at most :data:`ROW_CHUNK` = 3 positions, below the gemm's 4-row
groups and the tiled matmul's 8 rows, so every row runs the gemv a one-token forward runs (a verify of 16 rows
runs as 3 + 3 + 3 + 3 + 3 + 1); and it runs flash attention on a bfloat16 KV cache (:data:`CACHE_TYPE`: the
split path takes f16 and f32 only). A prompt's prefill asks for no logits and needs to agree only with itself
(every method prefills the same prompt the same way): it runs in llama.cpp's fastest batched form, a second
context over the weights as the GGUF stores them (:data:`PREFILL_REPACK`, the tiled matmul; repacked weights
prefilled 512 tokens in 6.69 s against 4.13 s in results/forward/20261207-0258-amd-epyc.md), whose KV cache is then
copied into the decoding context (``llama_state_seq_get_data``/``set_data``).

Measured (``benchmarks/forward_cost.py``, results/forward/): every row of a 16-row verify bit-equal to the
one-token forward, at 128 and at 700 cached positions for the 1.5B target (Q4_K/Q6_K; the variants table) and at
128 for the 0.5B draft (Q5_0/Q8_0/Q4_K/Q6_K; the main table); ``tests/decode/test_gguf.py`` checks ``exact`` == ``ar`` with the real library where it is
installed. A one-token forward costs what llama.cpp's defaults cost, and a prefill less: 32.9 ms against 33.8 and
4.13 s against 5.05 for 512 tokens in the variants table of results/forward/20261207-0320-amd-epyc.md (a 2-core
AMD EPYC), where loosespec's previous setting (no repacking, rows in pieces of 7) took 39.8 ms.

Needs ``llama-cpp-python`` (builds from source, 10-20 minutes on 2 cores): ``make peers``, or
``pip install 'loosespec[peers]'``. Hidden states and attention weights are not returned, so SpecGuard
(attention grounding) and transformers' own ``generate`` peers refuse this precision.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from loosespec.decode.kv import CachedLM, common_prefix_len
from loosespec.errors import LoosespecError

N_BATCH = 512  # positions per llama_decode call (a long prompt is fed in such chunks)
ROW_CHUNK = 3  # positions per llama_decode call that asks for logits: below the repacked gemm's groups of 4 rows
MAX_CONTEXT = 8192  # KV positions allocated, unless the model was trained on fewer
REPACK = True  # llama.cpp's repacked weight layouts (its "extra buffer types"): a gemv per row below 4 rows
PREFILL_REPACK = False  # the prefill's context: the GGUF's own layout, whose tiled matmul prefills fastest
FLASH_ATTN = 1  # llama.cpp's flash attention: -1 auto, 0 off, 1 on (off sends K.Q to llamafile's sgemm)
CACHE_TYPE = "bf16"  # the KV cache's type: f16 and f32 take flash attention's split and tiled paths
CACHE_TYPES = {"f16": 1, "q8_0": 8, "bf16": 30}  # ggml_type of the KV cache (ggml.h; llama_cpp lacks BF16's name)


def settings(
    repack: bool = REPACK,
    flash_attn: int = FLASH_ATTN,
    cache_type: str = CACHE_TYPE,
    row_chunk: int = ROW_CHUNK,
    prefill_repack: bool = PREFILL_REPACK,
) -> dict:
    """llama.cpp's settings a forward runs with (the defaults: what ``--quantize int4`` runs) and llama-cpp-python's
    version, without opening a model: what an int4 result depends on besides the model and the machine."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        installed = version("llama_cpp_python")
    except PackageNotFoundError:  # the tests' fake context, or not installed
        installed = None
    return {
        "llama_cpp_python": installed,
        "repack": repack,
        "flash_attn": flash_attn,
        "cache_type": cache_type,
        "row_chunk": row_chunk,
        "prefill_repack": prefill_repack,
    }


def available() -> bool:
    """Whether llama-cpp-python is installed (without importing it: the import loads a shared library)."""
    return importlib.util.find_spec("llama_cpp") is not None


def _import():
    try:
        import llama_cpp
        from llama_cpp import _internals
    except ImportError as e:
        raise LoosespecError(
            "--quantize int4 runs the GGUF weights in llama.cpp and needs llama-cpp-python "
            "(builds from source, 10-20 min): make peers, or pip install 'loosespec[peers]'"
        ) from e
    return llama_cpp, _internals


class GgufModel(torch.nn.Module):
    """What the rest of loosespec reads off a loaded model (config, generation config, output width, a float32
    parameter for the dtype and device) for weights that llama.cpp holds. It has no forward of its own: the
    engine runs it through :class:`GgufLM`, and anything that would call it as a transformers model (SpecGuard's
    attentions, ``generate`` peers) is refused before it starts (:data:`REFUSAL`)."""

    def __init__(self, gguf_file: Path, config, generation_config=None):
        super().__init__()
        self.gguf_file = Path(gguf_file)
        self.config = config
        self.generation_config = generation_config
        self.register_parameter("_anchor", torch.nn.Parameter(torch.zeros(1), requires_grad=False))

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32  # the logits llama.cpp returns

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def get_output_embeddings(self):
        return SimpleNamespace(out_features=int(self.config.vocab_size))

    def forward(self, *args, **kwargs):
        raise LoosespecError(REFUSAL)

    def generate(self, *args, **kwargs):
        raise LoosespecError(REFUSAL)


REFUSAL = (
    "this model runs in llama.cpp (--quantize int4), which returns logits only: SpecGuard's attention "
    "grounding and transformers' generate peers need a transformers model; use --quantize int8 or none"
)


def is_gguf(model) -> bool:
    return isinstance(model, GgufModel)


class GgufLM:
    """A llama.cpp context over one GGUF file, with the interface of :class:`~loosespec.decode.kv.CachedLM`:
    :meth:`logits`, :meth:`prefill`, :meth:`reset`, the forward count and the modelled cost."""

    def __init__(
        self,
        model: GgufModel,
        threads: int | None = None,
        n_ctx: int | None = None,
        repack: bool = REPACK,
        flash_attn: int = FLASH_ATTN,
        cache_type: str = CACHE_TYPE,
        row_chunk: int = ROW_CHUNK,
        prefill_repack: bool | None = PREFILL_REPACK,
    ):
        """``prefill_repack``: the weight layout of the context a prefill runs in (None: the decoding context's own);
        where it differs from ``repack``, a second context over the same file, opened at the first prefill."""
        if cache_type not in CACHE_TYPES:
            raise LoosespecError(f"cache_type must be one of {', '.join(CACHE_TYPES)}, got {cache_type!r}")
        if not 1 <= row_chunk <= N_BATCH:
            raise LoosespecError(f"row_chunk must be in 1..{N_BATCH}, got {row_chunk}")
        self.repack, self.flash_attn, self.cache_type, self.row_chunk = repack, flash_attn, cache_type, row_chunk
        self.prefill_repack = repack if prefill_repack is None else prefill_repack
        self.model = model
        self.device = torch.device("cpu")
        self.threads = threads or torch.get_num_threads()
        self._n_ctx = n_ctx or MAX_CONTEXT
        self._models: list = []  # llama.cpp's models, kept alive as long as their contexts
        self._ctx, self._batch, self.n_vocab, self.max_positions = self._open(model, self._n_ctx, repack)
        self._prefill_ctx = None
        self.forwards = 0
        self.cost = None
        self.modelled_s = 0.0
        self.modelled_prefill_s = 0.0
        self.recomputes = 0  # rollbacks llama.cpp refused, recomputed from scratch
        self.rollback_problem = None
        self.reset()

    def _open(self, model: GgufModel, n_ctx: int, repack: bool):
        """(context, batch, vocabulary size, positions) of a llama.cpp context on ``model``'s GGUF file, its weights
        repacked or not."""
        llama_cpp, internals = _import()
        from llama_cpp._logger import set_verbose

        set_verbose(False)  # llama.cpp's errors still reach stderr; its loading chatter does not
        llama_cpp.llama_backend_init()
        mparams = llama_cpp.llama_model_default_params()
        mparams.use_extra_bufts = repack
        lmodel = internals.LlamaModel(path_model=str(model.gguf_file), params=mparams, verbose=False)
        self._models.append(lmodel)
        trained = lmodel.n_ctx_train()
        positions = min(n_ctx, trained) if trained > 0 else n_ctx
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = positions
        cparams.n_batch = N_BATCH
        cparams.n_ubatch = N_BATCH
        cparams.n_seq_max = 1
        cparams.n_threads = self.threads
        cparams.n_threads_batch = self.threads
        cparams.flash_attn_type = self.flash_attn
        cparams.type_k = cparams.type_v = CACHE_TYPES[self.cache_type]
        ctx = internals.LlamaContext(model=lmodel, params=cparams, verbose=False)
        batch = internals.LlamaBatch(n_tokens=N_BATCH, embd=0, n_seq_max=1, verbose=False)
        return ctx, batch, lmodel.n_vocab(), positions

    @property
    def settings(self) -> dict:
        """What this forward's speed and rounding depend on besides the model and the machine (the cost curve's key,
        and a bench directory's: :func:`settings`)."""
        return settings(self.repack, self.flash_attn, self.cache_type, self.row_chunk, self.prefill_repack)

    def reset(self) -> None:
        self._ctx.kv_cache_clear()
        self.ids = torch.empty(0, dtype=torch.long)

    def prefill(self, seq: torch.Tensor) -> None:
        """Make the cache hold ``seq`` (one forward over what it lacks, in llama.cpp's fastest batched form; nothing
        when it holds it). Every method prefills its prompt the same way (:func:`loosespec.decode.loop.decode`), so
        a prefill need not match one-token forwards, only itself."""
        if seq.shape[0] and common_prefix_len(self.ids, seq) < seq.shape[0]:
            self._forward(seq, rows=0)

    @torch.inference_mode()
    def logits(self, seq: torch.Tensor, rows: int) -> torch.Tensor:
        """Logits of the last ``rows`` positions of ``seq`` ([rows, V] float32 on the CPU), computing only what the
        cache lacks (as :meth:`CachedLM.logits`). The rows asked for run in forwards of at most ``row_chunk``
        (:data:`ROW_CHUNK`) positions, where llama.cpp computes each row as a one-token forward would; what comes
        before them (a catch-up the rows do not ask for) runs in chunks of :data:`N_BATCH`."""
        if not 1 <= rows <= seq.shape[0]:
            raise LoosespecError(f"rows must be in 1..{int(seq.shape[0])}, got {rows}")
        return self._forward(seq, rows)

    def _forward(self, seq: torch.Tensor, rows: int) -> torch.Tensor:
        length = int(seq.shape[0])
        if length > self.max_positions:
            raise LoosespecError(
                f"sequence of {length} tokens exceeds the llama.cpp context of {self.max_positions} positions"
            )
        keep = min(common_prefix_len(self.ids, seq), length - max(rows, 1))
        if keep < self.ids.shape[0] and not self._ctx.kv_cache_seq_rm(0, keep, -1):
            self._ctx.kv_cache_clear()  # a partial removal the cache refused: recompute from scratch
            self.recomputes += 1
            keep = 0
        fed_from = keep
        ids = seq.tolist()
        first_out = length - rows
        out = np.empty((rows, self.n_vocab), dtype=np.float32)
        try:
            if keep == 0 and first_out > 0 and self.prefill_repack != self.repack:  # a prefill, in its own context
                if self._prefill_ctx is None:
                    self._prefill_ctx = self._open(self.model, self._n_ctx, self.prefill_repack)[0]
                self._prefill_ctx.kv_cache_clear()
                self._decode(self._prefill_ctx, ids, self._chunks(0, first_out, N_BATCH), first_out, out)
                self._ctx.kv_cache_clear()
                copy_sequence(self._prefill_ctx, self._ctx)
                self._prefill_ctx.kv_cache_clear()
                keep = first_out
            chunks = self._chunks(keep, first_out, N_BATCH) + self._chunks(max(keep, first_out), length, self.row_chunk)
            self._decode(self._ctx, ids, chunks, first_out, out)
        except BaseException:
            self.reset()  # a decode that failed half-way leaves the cache holding an unknown prefix
            raise
        self._counted(seq, length - fed_from)
        return torch.from_numpy(out)

    @staticmethod
    def _chunks(start: int, stop: int, step: int) -> list[tuple[int, int]]:
        return [(s, min(s + step, stop)) for s in range(start, stop, step)]

    def _decode(self, ctx, ids: list[int], chunks: list[tuple[int, int]], first_out: int, out: np.ndarray) -> None:
        """Feed ``ids`` to ``ctx`` in ``chunks`` (each one llama_decode call), positions from ``first_out`` on asking
        for logits, which land in ``out``'s rows."""
        batch = self._batch.batch
        for start, stop in chunks:
            batch.n_tokens = stop - start
            for j, pos in enumerate(range(start, stop)):
                batch.token[j] = ids[pos]
                batch.pos[j] = pos
                batch.seq_id[j][0] = 0
                batch.n_seq_id[j] = 1
                batch.logits[j] = pos >= first_out
            ctx.decode(self._batch)
            for pos in range(max(start, first_out), stop):  # llama_get_logits_ith: the index in this batch
                ptr = ctx.get_logits_ith(pos - start)
                ctypes.memmove(out[pos - first_out].ctypes.data, ptr, self.n_vocab * 4)

    _counted = CachedLM._counted  # the same booking of forwards and modelled cost


def copy_sequence(src, dst) -> None:
    """Copy sequence 0's KV cache from llama.cpp context ``src`` into ``dst`` (both over the same GGUF file, with the
    same cache type; ``dst``'s cache empty): what a prefill in one weight layout hands to decoding in another."""
    llama_cpp, _ = _import()
    size = llama_cpp.llama_state_seq_get_size(src.ctx, 0)
    buf = (ctypes.c_uint8 * size)()
    if llama_cpp.llama_state_seq_get_data(src.ctx, buf, size, 0) != size:
        raise LoosespecError("llama.cpp could not copy the prefill's KV cache out of its context")
    if llama_cpp.llama_state_seq_set_data(dst.ctx, buf, size, 0) == 0:
        raise LoosespecError("llama.cpp could not load the prefill's KV cache into the decoding context")
