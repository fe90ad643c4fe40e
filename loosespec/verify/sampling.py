"""Turning logits into the distribution a token is sampled from (temperature, top-k, top-p).

The warpers are transformers' own (``TemperatureLogitsWarper``, ``TopKLogitsWarper``,
``TopPLogitsWarper``), so ``temperature``/``top_k``/``top_p`` mean exactly what they mean in
``model.generate``. Temperature 0 means greedy: a one-hot distribution on the argmax, so rules
written for distributions also cover greedy decoding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from loosespec.errors import NonFiniteLogits


@dataclass(frozen=True)
class SamplingParams:
    # the knobs' defaults in loosespec.config, written out here (verify/ imports nothing above it): the marked
    # lines are the ones tests/verify/test_defaults.py keeps equal to them
    temperature: float = 0.0  # (knob default, tests/verify/test_defaults.py)
    top_p: float = 1.0  # (knob default, tests/verify/test_defaults.py)
    top_k: int = 0  # 0 disables top-k (knob default, tests/verify/test_defaults.py)
    # [V] bool: tokens that may be drawn at all (a draft restricted to the vocabulary it shares with
    # the target, loosespec.drafters.bridge); None: every token
    vocab_mask: torch.Tensor | None = field(default=None, compare=False)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Row-wise sampling distribution.

    logits:  [N, V] float
    returns: [N, V] float32, rows sum to 1
    """
    logits = logits.float()
    if params.vocab_mask is not None:
        logits = logits.masked_fill(~params.vocab_mask[: logits.shape[-1]].to(logits.device), float("-inf"))
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float32)
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scores = TemperatureLogitsWarper(params.temperature)(None, logits)
    if params.top_k > 0:
        scores = TopKLogitsWarper(top_k=params.top_k)(None, scores)
    if params.top_p < 1.0:
        scores = TopPLogitsWarper(top_p=params.top_p)(None, scores)
    return torch.softmax(scores, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row. probs: [N, V] -> [N] int64."""
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def check_finite(logits: torch.Tensor, who: str, dtype: torch.dtype | None = None) -> None:
    """Raise :class:`~loosespec.errors.NonFiniteLogits` when ``logits`` hold a NaN or an infinity. One
    device-to-host read: the decode loop calls it after its own read of the round's tokens, when the device
    is idle, and on the error path of a draw that failed."""
    if bool(torch.isfinite(logits).all()):
        return
    name = str(dtype).replace("torch.", "") if dtype is not None else "its dtype"
    hint = (
        "float16 overflows in some models' activations: use --dtype bfloat16 (GPUs from Ampere on) or float32"
        if dtype == torch.float16
        else "try --dtype float32"
    )
    raise NonFiniteLogits(f"the {who} model produced non-finite logits (NaN or inf) in {name}; {hint}")
