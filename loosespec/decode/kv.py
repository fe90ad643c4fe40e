"""A causal LM with its KV cache, the cache treated as a memo of the token ids it was computed on.

Every forward goes through :meth:`CachedLM.logits`: it compares the ids the cache holds with the
sequence asked for, rolls the cache back to their common prefix (:func:`rollback`, the only place
in loosespec that shortens a dynamic cache; :class:`StaticCachedLM` sets its static cache's length),
and feeds the rest. Callers never crop caches themselves: a
rejected draft is simply not part of the next sequence they ask for.

Rolling back, layer type by layer type (transformers' ``cache_utils``):

- full attention (``DynamicLayer``, DSA's ``DynamicIndexedLayer``) and layers without a cache
  (``DummyLayer``): ``crop`` drops the last positions.
- sliding-window and chunked attention (``DynamicSlidingWindowLayer``: Gemma 2/3, Mistral, Llama 4,
  ...). Left alone, such a layer keeps only the last ``window - 1`` positions, and transformers'
  ``crop`` refuses once the window is full: the positions before a rolled-back draft that the next
  forward attends to are gone. Here the layer records its past (``activate_past_recording``: a
  forward keeps everything it adds, and its queries still see only the last ``window - 1``
  positions before them), and :func:`rollback`, before every forward, cuts it back to its last
  ``window - 1 + ROLLBACK_MARGIN`` positions: memory stays bounded by the window, and a rollback of
  up to ``ROLLBACK_MARGIN`` positions (a rejected draft, an MLA candidate, a SpecGuard step of the
  default 128 tokens) finds what it needs. A deeper one recomputes the sequence from scratch
  (``CachedLM.recomputes`` counts them): slower, never wrong.
- anything else (linear-attention / state-space layers, whose recurrent state cannot be rewound;
  quantized and model-specific layers): :attr:`CachedLM.rollback_problem` says so, and the engine
  refuses speculative methods for that model with a :class:`~loosespec.errors.LoosespecError`
  before the first forward (``ar`` never rolls back and still runs).
"""

from __future__ import annotations

import torch

from loosespec.errors import LoosespecError


def common_prefix_len(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two 1-D int tensors."""
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0, 0]) if diff.numel() else n


ROLLBACK_MARGIN = 256  # positions a sliding-window layer keeps beyond its window, for rollbacks


def _layer_kinds():
    from transformers.cache_utils import DummyLayer, DynamicIndexedLayer, DynamicLayer, DynamicSlidingWindowLayer

    # exact classes: a subclass (hybrid linear-attention layers, quantized layers) has state of its own
    return (DynamicLayer, DynamicIndexedLayer, DummyLayer), DynamicSlidingWindowLayer


def rollback_problem(cache) -> str | None:
    """Why :func:`rollback` cannot shorten ``cache``, or None when it can (every layer of a known kind)."""
    croppable, sliding = _layer_kinds()
    bad = sorted(
        {type(layer).__name__ for layer in cache.layers if type(layer) not in croppable and type(layer) is not sliding}
    )
    if not bad:
        return None
    return (
        f"its cache has {', '.join(bad)} layers, which loosespec cannot roll back (it rolls back attention "
        "layers only: full, sliding-window, chunked; a linear-attention, convolutional or state-space layer keeps "
        "a running state, not one entry per position)"
    )


def _window_fits(layer, excess: int) -> bool:
    """Whether a past-recording ``DynamicSlidingWindowLayer`` without its last ``excess`` positions still
    holds the ``window - 1`` positions before its new end that the next forward attends to."""
    if not layer.is_initialized or layer.keys is None or layer.keys.numel() == 0:
        return True
    held, end = layer.keys.shape[-2], layer.cumulative_length  # it holds positions [end - held, end)
    return held - excess >= min(end - excess, layer.sliding_window - 1)


def _window_crop(layer, excess: int, margin: int) -> None:
    """Drop the last ``excess`` positions of a sliding-window layer (:func:`_window_fits`) and trim it
    to its last ``window - 1 + margin``."""
    if not layer.is_initialized or layer.keys is None or layer.keys.numel() == 0:
        return
    stop = layer.keys.shape[-2] - excess
    start = max(0, stop - (layer.sliding_window - 1 + margin))
    if start or excess:
        layer.keys = layer.keys[..., start:stop, :]
        layer.values = layer.values[..., start:stop, :]
        layer.cumulative_length -= excess


def rollback(cache, keep: int, margin: int = ROLLBACK_MARGIN) -> bool:
    """Shorten ``cache`` to its first ``keep`` positions. The one KV-rollback site (module docstring).

    Called before every forward, also with nothing to drop (``keep`` = the cached length), which
    trims the sliding-window layers. False, with the cache unchanged, when a sliding-window layer no
    longer holds what the shortened cache needs: the caller recomputes from scratch.
    """
    _, sliding = _layer_kinds()
    excess = max(cache.get_seq_length() - keep, 0)
    windows = [layer for layer in cache.layers if type(layer) is sliding]
    if excess:
        problem = rollback_problem(cache)
        if problem:
            raise LoosespecError(f"cannot roll back the KV cache: {problem}")
        if not all(_window_fits(layer, excess) for layer in windows):  # all or nothing
            return False
    for layer in cache.layers:
        if type(layer) is sliding:
            _window_crop(layer, excess, margin)
        elif excess:
            layer.crop(-excess)  # transformers >= 5.2x: a negative count of positions to drop
    return True


class CachedLM:
    """A model plus a ``DynamicCache``; counts its forwards."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.device = next(model.parameters()).device
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        self.forwards = 0
        self.cost = None  # a loosespec.cost.CostCurve: when set, every forward adds its modelled seconds
        self.modelled_s = 0.0  # forwards that extend a cached sequence (what drafting and verifying cost)
        self.modelled_prefill_s = 0.0  # forwards from an empty cache: once per generation, not per drafted token
        self.margin = ROLLBACK_MARGIN
        self.recomputes = 0  # rollbacks too deep for a sliding-window layer, recomputed from scratch
        self.reset()

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        _, sliding = _layer_kinds()
        for layer in self.cache.layers:
            if type(layer) is sliding:
                layer.activate_past_recording()  # keep what a rollback needs; rollback() trims (module docstring)
        self.ids = torch.empty(0, dtype=torch.long)  # [cache length] on the CPU

    @property
    def rollback_problem(self) -> str | None:
        """Why this model's cache cannot be rolled back (speculative methods need it), or None."""
        return rollback_problem(self.cache)

    def prefill(self, seq: torch.Tensor) -> None:
        """Make the cache hold ``seq`` (one forward over what it lacks; nothing when it holds it)."""
        if seq.shape[0] and common_prefix_len(self.ids, seq) < seq.shape[0]:
            self.forward(seq, rows=1)

    @torch.inference_mode()
    def logits(self, seq: torch.Tensor, rows: int) -> torch.Tensor:
        """Logits of the last ``rows`` positions of ``seq``, computing only what the cache lacks.

        seq:     [L] int64 on the CPU, the whole sequence (prompt + committed + proposed)
        returns: [rows, V] float32 on the model's device; row i predicts the token after
                 ``seq[L - rows + i]``
        """
        return self.forward(seq, rows).logits[0, -rows:].float()

    @torch.inference_mode()
    def forward(self, seq: torch.Tensor, rows: int, **outputs):
        """The model's output for the uncached tail of ``seq`` (at least its last ``rows`` ids).

        ``outputs`` are passed to the model (``output_hidden_states=True``,
        ``output_attentions=True``); hidden states and attentions cover the fed positions only,
        which are the last ``rows`` when the rest is cached.
        """
        keep = self._reusable(seq, rows)
        if not rollback(self.cache, keep, self.margin):  # deeper than a sliding window's margin
            self.reset()
            self.recomputes += 1
            keep = 0
        new = seq[keep:].unsqueeze(0).to(self.device)  # [1, L - keep]
        try:
            out = self.model(input_ids=new, past_key_values=self.cache, use_cache=True, logits_to_keep=rows, **outputs)
        except BaseException:
            self.reset()  # a forward that died half-way leaves layers of different lengths
            raise
        self._counted(seq, new.shape[1])
        return out

    def _reusable(self, seq: torch.Tensor, rows: int) -> int:
        """How many leading ids of ``seq`` the cache can keep for a forward that returns its last ``rows``;
        refuses a sequence longer than the model's context."""
        if self.max_positions is not None and seq.shape[0] > self.max_positions:
            raise LoosespecError(
                f"sequence of {seq.shape[0]} tokens exceeds the model's context of {self.max_positions}"
            )
        return min(common_prefix_len(self.ids, seq), seq.shape[0] - rows)

    def _counted(self, seq: torch.Tensor, fed: int) -> None:
        """Book a finished forward: the cache now holds ``seq``; ``fed`` positions ran (the modelled cost's). A
        forward that filled an empty cache (a draft model's first forward reads the whole prompt) is booked apart:
        charged to the round that happened to run it, it made a draft token look as dear as a prompt, and the
        cost-aware draft length never tried the draft model again (issue 41)."""
        prefill = fed == seq.shape[0] and fed > 1
        self.ids = seq
        self.forwards += 1
        if self.cost is not None:
            if prefill:
                self.modelled_prefill_s += self.cost(fed)
            else:
                self.modelled_s += self.cost(fed)


STATIC_BUCKETS = (1, 2, 4, 8, 16, 32)  # fed lengths the compiled forward is specialised to (padded up to one)
DEFAULT_MAX_CACHE_LEN = 8192


class StaticCachedLM(CachedLM):
    """A :class:`CachedLM` on a preallocated ``StaticCache``, with ``torch.compile``'d fixed-shape forwards
    (``compile=True``). ``Engine.load(cache_implementation="static", compile=...)``; off by default.

    Why: at batch 1 on a GPU a forward is mostly kernel launches, so a 0.5B draft costs nearly what
    the 1.5B target does per forward. CUDA graphs (``torch.compile(mode="reduce-overhead")``) replay
    a forward's launches at once, but need fixed shapes and fixed tensor addresses: a cache
    allocated once at ``max_cache_len`` positions (transformers' ``StaticCache``) and a few fixed
    fed lengths.

    - Rolling back is setting the layers' length counters, in place (the tensors keep their
      addresses): positions past the length are stale, never attended (a query attends to the
      positions before it only), and overwritten by the next forward.
    - With ``compile``, a forward of at most 32 new tokens after the prefill, asking for logits only,
      is padded to the next of :data:`STATIC_BUCKETS` (a draft step: 1; a verify of K + 1 = 16
      at K = 15: 16) and runs the compiled graph; the padded rows' logits are dropped and their
      keys and values lie past the length. The prefill, longer feeds and forwards that return
      hidden states or attentions run eagerly on the same cache.
    - The padded forward rounds like a forward over the bucket's length, not the real one
      (``docs/cpu-precision.md``, batch invariance): in a low precision a near-tie can flip against the
      dynamic-cache path.
    - Full-attention models only (every layer a ``StaticLayer``): a sliding-window static layer is a
      ring buffer that cannot be rolled back; such a model is refused with the reason.

    On a CPU compiling takes minutes per fed length and its speed is unmeasured; on a GPU the smoke run measures it
    (``docs/gpu.md``). Until then the flag stays off by default. ``compile_backend`` is ``torch.compile``'s (tests
    use ``eager``: dynamo's tracing and the padding, without inductor's minutes).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        max_cache_len: int = DEFAULT_MAX_CACHE_LEN,
        compile: bool = False,
        compile_backend: str = "inductor",
    ):
        from transformers.cache_utils import StaticLayer

        if max_cache_len < 1:
            raise LoosespecError(f"max_cache_len must be >= 1, got {max_cache_len}")
        self.max_cache_len = max_cache_len
        self.cache = None
        super().__init__(model)
        kinds = sorted({type(layer).__name__ for layer in self.cache.layers if type(layer) is not StaticLayer})
        if kinds:
            raise LoosespecError(
                f"cache_implementation 'static' needs full attention in every layer; this model's static cache has "
                f"{', '.join(kinds)} layers, which loosespec cannot roll back in place: use cache_implementation "
                "'dynamic'"
            )
        self.compiled_forwards = 0  # forwards that ran the compiled graph
        self._compiled = None
        if compile:
            mode = "reduce-overhead" if self.device.type == "cuda" else None  # CUDA graphs where there are some
            self._compiled = torch.compile(
                model.forward,
                backend=compile_backend,
                mode=mode if compile_backend == "inductor" else None,
                dynamic=False,
            )

    def reset(self) -> None:
        from transformers import StaticCache

        if self.cache is None:  # allocated once (lazily, at the first forward): the addresses CUDA graphs keep
            self.cache = StaticCache(config=self.model.config, max_cache_len=self.max_cache_len)
        self._length = None  # unknown: the next _set_length writes it
        self._set_length(0)
        self.ids = torch.empty(0, dtype=torch.long)

    def _set_length(self, n: int) -> None:
        """Set every layer's length counter (one fill each, a kernel launch on a GPU) unless it already is ``n``."""
        if n != self._length:
            for layer in self.cache.layers:
                layer.cumulative_length.fill_(n)
            self._length = n

    @property
    def rollback_problem(self) -> str | None:
        return None  # every layer is a StaticLayer (checked when built)

    @torch.inference_mode()
    def forward(self, seq: torch.Tensor, rows: int, **outputs):
        """As :meth:`CachedLM.forward`, on the static cache (the class docstring)."""
        length = seq.shape[0]
        keep = self._reusable(seq, rows)
        n = length - keep
        bucket = None
        if self._compiled is not None and keep > 0 and not outputs:
            bucket = next((b for b in STATIC_BUCKETS if b >= n and keep + b <= self.max_cache_len), None)
        if keep + (bucket or n) > self.max_cache_len:
            raise LoosespecError(
                f"sequence of {length} tokens exceeds the static cache's {self.max_cache_len} "
                "positions: raise max_cache_len (--max-cache-len)"
            )
        self._set_length(keep)
        new = seq[keep:]
        try:
            if bucket is None:
                out = self.model(
                    input_ids=new.unsqueeze(0).to(self.device),
                    past_key_values=self.cache,
                    use_cache=True,
                    logits_to_keep=rows,
                    **outputs,
                )
                self._length = keep + n  # the forward advanced the counters itself
            else:
                fed = torch.cat([new, new.new_zeros(bucket - n)]) if bucket > n else new
                out = self._compiled(
                    input_ids=fed.unsqueeze(0).to(self.device),
                    past_key_values=self.cache,
                    use_cache=True,
                    logits_to_keep=bucket,
                )
                # a copy: a CUDA graph's next replay overwrites its output buffers
                out.logits = out.logits[:, n - rows : n].clone()
                self._length = keep + bucket  # where the forward left the counters
                self._set_length(keep + n)  # the padding is not part of the sequence
                self.compiled_forwards += 1
        except BaseException:
            self.reset()  # lengths and contents no longer agree
            raise
        self._counted(seq, bucket or n)
        return out
