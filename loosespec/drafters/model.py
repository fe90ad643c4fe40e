"""A small draft model proposing autoregressively with its own KV cache.

Greedy (temperature 0) or sampled with the same temperature/top-k/top-p as the target, in which
case each proposed token carries the distribution it was drawn from (``q`` for rejection
sampling). Drafting stops early at an end-of-sequence token and, when greedy, when the draft's
top probability falls below ``confidence_threshold`` (transformers' ``assistant_confidence_threshold``
idea: a draft the draft model itself doubts is rarely accepted, and every extra token costs a
draft forward).
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from loosespec.decode.kv import CachedLM
from loosespec.drafters.base import Draft, Drafter
from loosespec.verify.sampling import SamplingParams, check_finite, logits_to_probs, sample


class ModelDrafter(Drafter):
    name = "model"

    def __init__(
        self,
        lm: CachedLM,
        sampling: SamplingParams,
        generator: torch.Generator | None,
        stop_ids: Collection[int] = (),
        confidence_threshold: float = 0.0,
    ):
        self.lm = lm
        self.sampling = sampling
        self.generator = generator
        self.stop_ids = frozenset(stop_ids)
        self.confidence_threshold = confidence_threshold

    def propose(self, seq: torch.Tensor, k: int) -> Draft:
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        for _ in range(k):
            logits = self.lm.logits(torch.cat([seq, torch.tensor(tokens, dtype=torch.long)]), rows=1)  # [1, V]
            if self.sampling.greedy:
                top = torch.softmax(logits[0], dim=-1).max(dim=-1)
                # token and probability in one device-to-host read (float64 holds any vocabulary index exactly)
                index, value = torch.stack([top.indices.double(), top.values.double()]).tolist()
                token = int(index)
                if value != value:  # NaN: the logits were not finite (read with the token, no extra sync)
                    check_finite(logits, "draft", self.lm.model.dtype)
                confident = value >= self.confidence_threshold
            else:
                q = logits_to_probs(logits, self.sampling)  # [1, V]
                try:
                    token, confident = int(sample(q, self.generator)), True
                except RuntimeError:  # multinomial refuses NaN/inf probabilities: say why
                    check_finite(logits, "draft", self.lm.model.dtype)
                    raise
                probs.append(q[0])
            tokens.append(token)
            if token in self.stop_ids or not confident:
                break
        return Draft(torch.tensor(tokens, dtype=torch.long), torch.stack(probs) if probs else None)
