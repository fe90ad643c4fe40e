"""Independent transcriptions of two other FLy implementations' acceptance rules, for the conformance tests
(tests/verify/test_fly_conformance.py, and tests/integrations/test_vllm_native_fly.py in vLLM's environment).

Written from reading the sources, as plain per-position Python loops: nothing here calls loosespec's rule, and the
structure follows each source (the official code's mask arithmetic, vLLM's sequential pending-window state
machine), not loosespec's vectorised masks. Only torch is needed (this module is imported in vLLM's own
environment too).

- **official**: AMD-AGI/FLy (the paper's code), ``fly/models/FLy.py`` at commit
  6667ae8477d087732eb71d7bdaa0d1cb94462a60: ``SPDGenerate._batch_verification`` (T = 0: argmax match; T > 0: either
  of two samples from ``softmax(logits / T)``, the first is the correction), ``calculate_topk_entropy`` (top-3 of
  ``log_softmax`` of the raw logits), ``rej_by_entropy``, the ``enable_fly`` block of the generation loop
  (``win_len`` counts the mismatch: the windows ``[False, True * (win_len - 1)]`` over the accepted mask, then the
  last ``win_len`` positions reset to the exact match), ``entropy_thre`` taken as "no gate" at or below 0.01, and
  ``_create_output`` (keep up to the first rejection, then the correction, or the bonus after a full draft).
  Its counters: ``total_initial_mismatch`` and ``total_fly_accepted`` (counted *before* the gate is applied).
- **vllm**: vLLM 0.34.0 (the PyPI wheel, ``vllm/_version.py`` commit 62d4bc3c7),
  ``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py`` ``_rejection_kernel`` (its ``FLY_WINDOW_SIZE > 0``
  branches: a native rejection becomes a *pending* one when it may be deferred, the next ``W`` decisions must all
  be native acceptances to commit it, any native rejection inside the window ends verification at the pending
  position with the target's choice there) and ``vllm/v1/worker/gpu/spec_decode/fly.py`` ``compute_fly_entropy``;
  ``vllm/config/speculative.py`` (``fly_window_size`` defaults to ``min(6, K - 1)``, must be in ``[1, K)``). vLLM
  0.33.0's V1 pre-pass (``vllm/v1/spec_decode/fly.py``: ``apply_fly_greedy_acceptance_kernel``,
  ``apply_fly_random_acceptance_kernel``) decides the same with a mask, as :func:`vllm_native_sampled` does.

The window parameter: loosespec's and vLLM's ``fly_window_size`` W counts the positions *after* the mismatch; the
official code's ``win_len`` counts the mismatch too: ``win_len = W + 1``.
"""

from __future__ import annotations

import math

import torch

V = 12  # the hand-built cases' vocabulary


def official_entropy(logits: torch.Tensor) -> list[float]:
    """The official ``calculate_topk_entropy(logits, 3)``: log_softmax, its top 3, -sum p log p."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    top = torch.topk(logp, min(3, logits.shape[-1]), dim=-1).values
    return (-(top.exp() * top).sum(-1)).tolist()


def vllm_entropy(logits: torch.Tensor, top_k: int = 3, probs: bool = False) -> list[float]:
    """vLLM's ``compute_fly_entropy``: from logits (``from_logits``) or from processed probabilities."""
    x = logits.float()
    top = torch.topk(x, min(top_k, x.shape[-1]), dim=-1).values
    if probs:
        p, logp = top, top.log()
    else:
        logp = top - x.logsumexp(-1, keepdim=True)
        p = logp.exp()
    return (-torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1)).tolist()


def official_accept(
    match: list[bool], entropy: list[float], theta: float, win_len: int, enable_fly: bool = True
) -> tuple[list[bool], dict]:
    """The official code's final accepted mask over one round's exact-match mask, and its two counters."""
    k = len(match)
    accepted = list(match)
    gate_on = theta > 1e-2  # entropy_thre = thre if thre > 1e-2 else None
    if gate_on:  # rej_by_entropy(accepted, ...): False only at a confident mismatch
        rej_mask = [not (entropy[j] < theta and not match[j]) for j in range(k)]
    if enable_fly and k >= win_len:
        matched = [(not match[j]) and all(match[j + o] for o in range(1, win_len)) for j in range(k - win_len + 1)]
        updated = [accepted[j] or (j < len(matched) and matched[j]) for j in range(k)]
        for j in range(k - win_len, k):  # updated[:, -win_len:] &= accepted[:, -win_len:]
            updated[j] = updated[j] and match[j]
        accepted = updated
    counters = {
        "total_initial_mismatch": sum(not m for m in match),
        "total_fly_accepted": sum((not m) and a for m, a in zip(match, accepted)),
    }  # before the gate
    if gate_on:
        accepted = [a and r for a, r in zip(accepted, rej_mask)]
    return accepted, counters


def first_false(mask: list[bool]) -> int:
    n = 0
    while n < len(mask) and mask[n]:
        n += 1
    return n


def official_greedy(draft: list[int], logits: torch.Tensor, theta: float, win_len: int) -> tuple[list[int], dict]:
    """The official rule at T = 0 on one round: draft [k], logits [k + 1, V] (the last row gives the bonus).
    Returns (emitted tokens, counters)."""
    k = len(draft)
    target = logits.argmax(-1).tolist()
    match = [draft[j] == target[j] for j in range(k)]
    accepted, counters = official_accept(match, official_entropy(logits[:k]), theta, win_len)
    n = first_false(accepted)
    return draft[:n] + [target[n]], counters  # target[k] is the bonus


def official_two_sample(
    draft: list[int], logits: torch.Tensor, temperature: float, theta: float, win_len: int, gen: torch.Generator
) -> list[int]:
    """The official rule at T > 0: a draft token matches when it equals either of two samples from
    softmax(logits / T); the correction is the first sample, the bonus a sample of the last row."""
    k = len(draft)
    probs = torch.softmax(logits.float() / temperature, -1)
    first = torch.multinomial(probs[:k], 1, generator=gen).squeeze(-1).tolist()
    second = torch.multinomial(probs[:k], 1, generator=gen).squeeze(-1).tolist()
    bonus = int(torch.multinomial(probs[k], 1, generator=gen))
    match = [draft[j] in (first[j], second[j]) for j in range(k)]
    accepted, _ = official_accept(match, official_entropy(logits[:k]), theta, win_len)
    n = first_false(accepted)
    return draft[:n] + ([first[n]] if n < k else [bonus])


def vllm_native_greedy(draft: list[int], logits: torch.Tensor, theta: float, window: int, top_k: int = 3) -> list[int]:
    """vLLM's native FLy for a greedy request (V2 ``_rejection_kernel``, FLY_WINDOW_SIZE = window >= 1): returns
    the emitted tokens (kept draft prefix, then the correction or the bonus)."""
    assert window >= 1, "vLLM's native FLy needs fly_window_size >= 1 (0 turns FLy off in its kernel)"
    k = len(draft)
    target = logits.argmax(-1).tolist()
    entropy = vllm_entropy(logits[:k], top_k)
    accepted_length, pending, rejected_argmax, verifying = 0, -1, 0, True
    for i in range(k):
        if not verifying:
            break
        accepted = target[i] == draft[i]
        can_defer = bool(logits[i, draft[i]] > float("-inf"))
        if pending >= 0:  # only native acceptance confirms a pending window
            verifying = accepted
            if accepted and i - pending == window:
                accepted_length, pending = i + 1, -1
        elif accepted:
            accepted_length = i + 1
        else:
            rejected_argmax = target[i]
            verifying = can_defer and i + window < k and entropy[i] >= theta
            if verifying:
                pending = i
    if accepted_length < k:
        return draft[:accepted_length] + [rejected_argmax]
    return draft + [target[k]]


def vllm_native_sampled(
    draft: list[int],
    q: torch.Tensor | None,
    logits: torch.Tensor,
    theta: float,
    window: int,
    gen: torch.Generator,
    temperature: float = 1.0,
    top_k: int = 3,
) -> list[int]:
    """vLLM's native FLy for a sampled request (V1 pre-pass ``apply_fly_random_acceptance_kernel`` then the native
    rejection sampler): ``p = softmax(logits / T)`` (vLLM's processed target distribution, which its gate reads),
    ``q`` the draft's distribution per position (None: one-hot, n-gram). Native acceptance ``p/q >= u``; a native
    rejection is deferred (u set to 0) when q > 0, p > 0, the window fits, the gate is open and the next
    ``window`` positions are natively accepted; the correction at the first rejection is drawn from
    ``max(0, p - q)`` normalised, the bonus from the last row of ``p``."""
    k = len(draft)
    p = torch.softmax(logits.float() / temperature, -1)
    entropy = vllm_entropy(p[:k], top_k, probs=True)
    u = torch.rand(k, generator=gen).tolist()

    def q_of(j: int, tok: int) -> float:
        return 1.0 if q is None else float(q[j, tok])

    native = [q_of(j, draft[j]) > 0 and float(p[j, draft[j]]) / q_of(j, draft[j]) >= u[j] for j in range(k)]
    accepted = list(native)
    for j in range(k):
        if (
            not native[j]
            and q_of(j, draft[j]) > 0
            and float(p[j, draft[j]]) > 0
            and j + window < k
            and entropy[j] >= theta
            and all(native[j + o] for o in range(1, window + 1))
        ):
            accepted[j] = True
    n = first_false(accepted)
    if n == k:
        return draft + [int(torch.multinomial(p[k], 1, generator=gen))]
    q_n = q[n] if q is not None else torch.nn.functional.one_hot(torch.tensor(draft[n]), p.shape[-1]).float()
    residual = (p[n] - q_n).clamp(min=0)
    dist = residual / residual.sum() if float(residual.sum()) > 0 else p[n]
    return draft[:n] + [int(torch.multinomial(dist, 1, generator=gen))]


# --- inputs -------------------------------------------------------------------------------------------------


def logits_for(target: list[int], flat=(), vocab: int = V, masked: dict | None = None) -> torch.Tensor:
    """[len(target), vocab] logits whose argmax is ``target``: rows in ``flat`` uncertain (top-3 entropy about
    0.62 nats), the others confident (about 0.009 nats); ``masked`` {row: token}: that token's logit is -inf."""
    z = torch.zeros(len(target), vocab)
    for j, t in enumerate(target):
        if j in flat:
            z[j, t] += 0.3
            z[j, (t + 1) % vocab] += 0.2
            z[j, (t + 2) % vocab] += 0.1
        else:
            z[j, t] += 8.0
    for row, tok in (masked or {}).items():
        z[row, tok] = float("-inf")
    return z


THETAS = (0.0, 0.05, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0, math.inf)


def random_round(gen: torch.Generator, k: int, theta: float, vocab: int = 8) -> tuple[list[int], torch.Tensor]:
    """One round: a draft of k tokens and target logits [k + 1, vocab] with entropies spread over [0, ln 3] and a
    draft that matches the target's choice most of the time, none of whose rows' entropy lies within 1e-4 of
    ``theta`` (float rounding between two ways of computing it could otherwise decide such a row)."""
    while True:
        scale = torch.rand(k + 1, 1, generator=gen) ** 2 * 5.0  # 0: flat rows, 5: confident ones
        z = torch.randn(k + 1, vocab, generator=gen) * scale
        target = z.argmax(-1)
        p_match = 0.6 + 0.38 * float(torch.rand(1, generator=gen))
        hit = torch.rand(k, generator=gen) < p_match
        other = (target[:k] + torch.randint(1, vocab, (k,), generator=gen)) % vocab
        draft = torch.where(hit, target[:k], other).tolist()
        h = torch.tensor(official_entropy(z[:k].double()), dtype=torch.float64)
        if math.isinf(theta) or not bool(((h - theta).abs() < 1e-4).any()):
            return draft, z
