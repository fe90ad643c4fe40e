"""SpecGuard's step-level acceptance rule as pure functions on tensors (LOSSY).

SpecGuard (methods.md §4) verifies a whole reasoning *step* drafted by the small model, not
tokens: among k draft candidates it picks the most consistent one (:func:`medoid`), scores it with
two signals the draft model computes anyway, and accepts it without asking the target when they
agree it is trustworthy:

- grounding G (:func:`grounding_from_step_rows`, equal to :func:`grounding_score` of
  :func:`attention_rollout`): attention rollout over the draft's last 3 layers; per step token,
  the rollout mass on positions *before* the step (prompt and accepted steps); the minimum over
  the step's tokens. A step whose tokens attend mostly to themselves is poorly grounded.
- confidence C (:func:`step_confidence`): exp of the mean token log-probability of the step under
  the draft (``sg_confidence mean``, the default: the geometric mean of the tokens' probabilities), or
  of the minimum (``min``), in (0, 1].
- S = beta * C + (1 - beta) * G (:func:`step_score`); accept iff S >= tau (:func:`accept_step`).
  The defaults (``sg_beta`` 0.8, ``sg_tau`` 0.825098, ``sg_confidence mean``) are the calibration's
  choice (``results/calibration/specguard.md``), where G on its own carried no information about
  which steps the target prefers; :mod:`loosespec.eval.specguard_diag` measures G other ways.

An accepted step is the draft's text, which the target may not have written: the rule is lossy.

Worked example (the defaults): a step whose tokens have a mean log-prob of -0.1 (C = 0.905) and
whose least grounded token keeps 0.6 of its rollout mass on the context (G = 0.6) scores
S = 0.8 * 0.905 + 0.2 * 0.6 = 0.844, accepted at tau 0.825098; with a mean log-prob of -0.15
(C = 0.861), S = 0.809, rejected.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence

import torch

ROLLOUT_LAYERS = 3  # the last 3 layers of the draft model
ROLLOUT_MIN_WEIGHT = 0.01  # head-averaged attention below this is zeroed before the rollout


def _rollout_step(attn: torch.Tensor, threshold: float, offset: int) -> torch.Tensor:
    """Head-mean, sparsify, add identity, row-normalise.

    attn:    [heads, R, C] attention rows of one layer; row i sits at position ``offset + i``
    returns: [R, C] row-stochastic
    """
    a = attn.float().mean(dim=0)  # [R, C]
    a = torch.where(a < threshold, torch.zeros_like(a), a)
    rows = torch.arange(a.shape[0])
    a[rows, rows + offset] += 1.0  # the residual connection: identity
    return a / a.sum(dim=-1, keepdim=True)


def attention_rollout(attentions: torch.Tensor, threshold: float = ROLLOUT_MIN_WEIGHT) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020) over the given layers, first to last.

    attentions: [layers, heads, L, L] causal attention probabilities of consecutive layers
    returns:    [L, L] R = A_n ... A_2 A_1, each A = rownorm(sparsify(mean_heads(attn)) + I)

    >>> a = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])  # 1 layer, 1 head
    >>> attention_rollout(a)  # row 1: (0.5, 0.5 + 1) / 2
    tensor([[1.0000, 0.0000],
            [0.2500, 0.7500]])
    """
    rollout = None
    for layer in attentions:
        a = _rollout_step(layer, threshold, 0)
        rollout = a if rollout is None else a @ rollout
    return rollout


def grounding_score(rollout: torch.Tensor, step_start: int) -> float:
    """min over step tokens t >= step_start of sum_{j < step_start} rollout[t, j].

    rollout: [L, L]; step tokens are positions step_start .. L - 1
    """
    return float(rollout[step_start:, :step_start].sum(dim=-1).min())


def grounding_from_step_rows(
    step_attentions: Sequence[torch.Tensor], step_start: int, threshold: float = ROLLOUT_MIN_WEIGHT
) -> float:
    """:func:`grounding_score` of :func:`attention_rollout`, from the step's attention rows only.

    step_attentions: per layer, first to last, [heads, S, L] the rows of the S step tokens
                     (positions step_start .. L - 1) over all L positions: what one cached
                     forward over the step returns
    Why the context rows are not needed: a context row attends (causally) only to context
    positions and stays row-stochastic, so its rollout mass on the context is exactly 1 at every
    layer. Propagating the vector "mass on the context" v through the layers (v = A v, context
    entries fixed at 1) gives the step rows of R 1_ctx without the L x L matrices.
    """
    v = None
    for attn in step_attentions:
        a = _rollout_step(attn, threshold, step_start)  # [S, L]
        full = torch.ones(a.shape[1])
        full[step_start:] = 0.0 if v is None else v  # before the first layer: the indicator of the context
        v = a @ full  # [S]
    return float(v.min())


def step_confidence(logprobs: torch.Tensor, reduce: str = "min") -> float:
    """A step's confidence from its [S] token log-probs under the draft -> (0, 1].

    ``"mean"``: exp(mean log-prob), the seed's description (the geometric mean of the tokens'
    probabilities); ``"min"``: exp(min log-prob), the weakest token (a choice where the paper is
    silent about aggregation, stricter on long steps).
    """
    if reduce == "mean":
        return math.exp(float(logprobs.mean()))
    if reduce != "min":
        raise ValueError(f"reduce must be 'min' or 'mean', got {reduce!r}")
    return math.exp(float(logprobs.min()))


def step_score(confidence: float, grounding: float, beta: float) -> float:
    """S = beta * C + (1 - beta) * G."""
    return beta * confidence + (1.0 - beta) * grounding


def accept_step(score: float, tau: float) -> bool:
    """Accept the draft's step iff S >= tau (tau = 0 accepts all, tau > 1 none)."""
    return score >= tau


def both_agree(confidence: float, grounding: float, tau: float, grounding_tau: float) -> bool:
    """The seed's rule: accept the draft's step iff both signals agree, C >= tau and G >= grounding_tau."""
    return confidence >= tau and grounding >= grounding_tau


def medoid(embeddings: torch.Tensor) -> int:
    """Index of the candidate with the highest mean cosine similarity to the others.

    embeddings: [k, D]; ties go to the lowest index (the greedy candidate comes first)

    >>> medoid(torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]]))
    1
    """
    k = embeddings.shape[0]
    if k <= 2:
        return 0  # one candidate, or two equally similar to each other: keep the first
    e = torch.nn.functional.normalize(embeddings.float(), dim=-1)
    sim = e @ e.T  # [k, k]
    mean_other = (sim.sum(dim=-1) - sim.diagonal()) / (k - 1)
    best = mean_other.max()
    return int((mean_other >= best - 1e-6).nonzero()[0, 0])


def step_length(
    tokens: Sequence[int], decode: Callable[[Sequence[int]], str], delimiter: str, stop_ids: Collection[int]
) -> int | None:
    """How many leading ``tokens`` make one complete step, or None if the step is unfinished.

    A step ends with the token whose text completes the first occurrence of ``delimiter``, or
    with an end token (EOS / end of turn), whichever comes first.

    >>> step_length([1, 2, 3], lambda t: "".join("ab\\n"[i - 1] for i in t), "\\n", ())
    3

    Called after every drafted token, so an unfinished step costs one ``decode``; only a step
    that is complete is scanned for the token that completed it.
    """
    stop_at = next((n for n, tok in enumerate(tokens, start=1) if tok in stop_ids), None)
    head = tokens[:stop_at] if stop_at is not None else tokens
    if delimiter not in decode(head):
        return stop_at
    return next(n for n in range(1, len(head) + 1) if delimiter in decode(head[:n]))
