"""A causal LM with its KV cache, the cache treated as a memo of the token ids it was computed on.

Every forward goes through :meth:`CachedLM.logits`: it compares the ids the cache holds with the
sequence asked for, rolls the cache back to their common prefix (:func:`rollback`, the only place
in loosespec that shortens a cache), and feeds the rest. Callers never crop caches themselves: a
rejected draft is simply not part of the next sequence they ask for.
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


def rollback(cache, keep: int) -> None:
    """Shorten ``cache`` to its first ``keep`` positions. The one KV-rollback site."""
    excess = cache.get_seq_length() - keep
    if excess > 0:
        cache.crop(-excess)  # transformers >= 5.2x: a negative count of positions to drop


class CachedLM:
    """A model plus a ``DynamicCache``; counts its forwards."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.device = next(model.parameters()).device
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        self.forwards = 0
        self.cost = None  # a loosespec.cost.CostCurve: when set, every forward adds its modelled seconds
        self.modelled_s = 0.0
        self.reset()

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self.ids = torch.empty(0, dtype=torch.long)  # [cache length] on the CPU

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
        if self.max_positions is not None and seq.shape[0] > self.max_positions:
            raise LoosespecError(
                f"sequence of {seq.shape[0]} tokens exceeds the model's context of {self.max_positions}"
            )
        keep = min(common_prefix_len(self.ids, seq), seq.shape[0] - rows)
        rollback(self.cache, keep)
        new = seq[keep:].unsqueeze(0).to(self.device)  # [1, L - keep]
        try:
            out = self.model(input_ids=new, past_key_values=self.cache, use_cache=True, logits_to_keep=rows,
                             **outputs)
        except BaseException:
            self.reset()  # a forward that died half-way leaves layers of different lengths
            raise
        self.ids = seq
        self.forwards += 1
        if self.cost is not None:
            self.modelled_s += self.cost(new.shape[1])
        return out
