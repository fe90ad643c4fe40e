"""FLy: training-free loosely speculative verification (LOSSY by design).

FLy keeps a mismatching draft token when the target was uncertain at that position (entropy
gate) and the draft "stays on track" afterwards (deferred window): the output is no longer the
target's own output, and every speed claim made with it must be paired with an accuracy
measurement. Spec: ``methods.md`` §3.

Given draft ``d[0..K-1]`` and the target's choice ``t[0..K]`` (argmax when greedy), start from the
exact-match mask ``E_j = (d_j == t_j)``. A mismatch at ``j`` is *deferred* (the draft token kept) iff

1. **gate**: ``H_j >= theta``, with ``H_j`` the entropy of the target's top-k probabilities
   (k = ``fly_entropy_top_k`` = 3; probabilities from the full softmax, not renormalised; natural
   log, so ``0 <= H <= ln 3``). ``theta = 0`` opens the gate always (the official code also turns
   the gate off for any theta in (0, 0.01]; the configuration refuses those values rather than
   guess which meaning was wanted: ``loosespec.config``). A mismatch with
   ``H_j < theta`` is a *hard reject* (the target is confident).
2. **window**: positions ``j+1 .. j+W-1`` are all exact matches. ``W = fly_window_size`` counts
   the mismatch itself: this is the official code's meaning; the paper's prose says "the next W
   tokens", which would be one more.
3. **boundary**: the window fits: ``j <= K - W - 1`` (the official code's bound, one stricter
   than the window strictly needs; kept so results match the reference implementation).

Mismatches inside another mismatch's window are ordinary (the window is judged on ``E``, never on
other deferrals). Final mask ``A = E or deferred``; the verdict keeps ``d[0:n]`` for the first
``n`` with ``A_n`` False and emits ``t_n`` (correction) or, if all are kept, ``t_K`` (bonus).

Worked example (K = 15, W = 6, theta = 0.3)::

    E = T T F T T T T T T F T T T T T      H_2 = 0.5, H_9 = 0.8
    j = 2: gate open, window 3..7 all match, 2 <= 8  -> deferred, draft token kept
    j = 9: gate open, window 10..14 all match, but 9 > 15 - 6 - 1 = 8  -> boundary reject
    verdict: d[0..8] kept (9 tokens) + t_9  -> 10 tokens

Each condition is a separate function returning a ``[K]`` bool mask and :func:`loose_mask`
composes any of them, so ablations are compositions: ``window only`` = ``loose_mask(E, window,
boundary)``, ``gate only`` = ``loose_mask(E, gate)``.

**Copy guard** (a labeled variant, not in the paper or the official code; off by default): with
``fly_copy_guard = n > 0`` a mismatch is not deferred when the draft tokens ``d[j .. j+n-1]`` (the
kept token and the n - 1 after it) occur verbatim in the prompt: :class:`PromptCopyGuard`. It answers a
failure class read in issue 20's MGSM runs, where a deferred draft token turned the answer into a copy
of the question and the answer went wrong. A refused deferral emits the target's own token there, so
the guard only moves output towards the target's; it is still LOSSY (every other deferral stands).

Sampling (T > 0) comes in two honestly named variants: ``two-sample`` (the official code: the
draft is greedy and ``d_j`` "matches" when it equals either of two target samples; lossy even
before loosening) and ``rejection`` (the loose rule layered on lossless rejection sampling: a
natively rejected position may be deferred under the same gate, window and boundary, the window
judged by native acceptance, as in the vLLM port).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from loosespec.config import knob_default
from loosespec.methods import FLY_COUNTERS, FLY_GUARD_COUNTERS
from loosespec.verify.exact import first_false, match_mask, prefix_verdict
from loosespec.verify.rejection import native_accept, next_token
from loosespec.verify.sampling import sample

# the knobs' declared defaults (loosespec.config), for callers of these functions that pass none
THETA, WINDOW, TOP_K = (knob_default(n) for n in ("fly_entropy_threshold", "fly_window_size", "fly_entropy_top_k"))
from loosespec.verify.types import Verdict


def topk_entropy(logits: torch.Tensor, k: int = 3) -> torch.Tensor:
    """Entropy (nats) of the top-k probabilities of the full softmax, not renormalised.

    logits:  [N, V] float
    returns: [N] float32, in [0, ln k]

    p = (0.9, 0.05, 0.03, ...) -> -(0.9 ln 0.9 + 0.05 ln 0.05 + 0.03 ln 0.03) ~= 0.349
    """
    logits = logits.float()
    top = logits.topk(min(k, logits.shape[-1]), dim=-1).values  # [N, k]
    logp = top - logits.logsumexp(dim=-1, keepdim=True)  # log-probabilities of the full softmax
    return -(logp.exp() * logp).nan_to_num(nan=0.0).sum(-1)  # p log p -> 0 for masked (-inf) logits


def gate_open(entropy: torch.Tensor, theta: float) -> torch.Tensor:
    """[K] True where the target is uncertain enough for a mismatch to be deferred (``H_j >= theta``)."""
    return entropy >= theta


def window_clear(match: torch.Tensor, window_size: int) -> torch.Tensor:
    """[K] True where positions ``j+1 .. j+W-1`` that lie inside the draft are all exact matches.

    Whether the window fits inside the draft at all is :func:`within_boundary`'s business.
    """
    k = match.shape[0]
    miss = torch.cat([torch.zeros(1, dtype=torch.long, device=match.device), (~match).long().cumsum(0)])  # [K+1]
    j = torch.arange(k, device=match.device)
    lo = (j + 1).clamp(max=k)
    hi = (j + window_size).clamp(max=k)  # exclusive end of the window, cut at the draft's end
    return (miss[hi] - miss[lo]) == 0


def within_boundary(k: int, window_size: int, device: torch.device | str = "cpu",
                    num_draft_tokens: int | None = None) -> torch.Tensor:
    """[k] True where a mismatch may be deferred in a draft of length k.

    With the nominal draft length K (``num_draft_tokens``, FLy's K = 15) equal to the draft's, this
    is the official code's ``j <= K - W - 1``. A draft cut shorter than K (the cost-aware draft
    length, an end token, the token budget) keeps the nominal bound and adds that the window
    ``j+1 .. j+W-1`` must lie inside the draft: ``j <= min(K - W - 1, k - W)``. So a shorter draft
    never defers where a full one would not, and FLy with K <= W never defers at all.
    """
    nominal = k if num_draft_tokens is None else max(num_draft_tokens, k)
    bound = nominal - window_size - 1 if nominal == k else min(nominal - window_size - 1, k - window_size)
    return torch.arange(k, device=device) <= bound


class PromptCopyGuard:
    """The copy guard of one request: the prompt's n-grams, built once; called on a round's draft it gives
    the ``copy`` mask of :func:`fly_mask`, [K] True where ``d[j .. j+n-1]`` is an n-gram of the prompt.

    Positions whose n tokens run past the draft's end are False: the guard cannot tell there, and the
    boundary keeps a deferral's window inside the draft anyway (``n <= W`` always fits).
    """

    def __init__(self, prompt_ids, n: int):
        if n < 1:
            raise ValueError(f"the copy guard compares n-grams of at least one token, got n = {n}")
        ids = prompt_ids.tolist() if isinstance(prompt_ids, torch.Tensor) else list(prompt_ids)
        self.n = n
        self.grams = frozenset(tuple(ids[i:i + n]) for i in range(len(ids) - n + 1))

    def __call__(self, draft_tokens: torch.Tensor) -> torch.Tensor:
        d, n = draft_tokens.tolist(), self.n
        hits = [j + n <= len(d) and tuple(d[j:j + n]) in self.grams for j in range(len(d))]
        return torch.tensor(hits, dtype=torch.bool, device=draft_tokens.device)


def loose_mask(match: torch.Tensor, *conditions: torch.Tensor) -> torch.Tensor:
    """``E or (not E and all conditions)``: accept a mismatch when every condition holds there."""
    deferred = ~match
    for c in conditions:
        deferred = deferred & c
    return match | deferred


def fly_mask(match: torch.Tensor, entropy: torch.Tensor, theta: float, window_size: int,
             num_draft_tokens: int | None = None, copy: torch.Tensor | None = None) -> torch.Tensor:
    """FLy's final acceptance mask: gate, window and boundary composed (see module docstring); with the copy
    guard's ``copy`` mask (:class:`PromptCopyGuard`), a mismatch that copies the prompt is not deferred."""
    k = match.shape[0]
    conditions = [gate_open(entropy, theta), window_clear(match, window_size),
                  within_boundary(k, window_size, match.device, num_draft_tokens)]
    if copy is not None:
        conditions.append(~copy)
    return loose_mask(match, *conditions)


def fly_events(match: torch.Tensor, entropy: torch.Tensor, theta: float, window_size: int,
               accept: torch.Tensor, num_draft_tokens: int | None = None,
               copy: torch.Tensor | None = None) -> dict[str, int]:
    """Counters for the mismatches the rule actually ruled on (positions up to the first reject).

    ``fly_prefix_mismatches`` = deferred + hard (gate) + window + boundary rejects, where a rejected
    mismatch is attributed to the first condition it fails in that order. These are loosespec's own
    definitions: the official FLy code counts mismatches over all K draft positions before the gate,
    including those after the first reject, so its rates are not these (hence the ``prefix`` in the
    name, which was ``fly_mismatches`` in results written before 2026-12-01). With the copy guard on
    (``copy`` given) a sixth counter, ``fly_copy_rejects``, counts the mismatches that passed gate, window
    and boundary and that only the guard refused; the sum above then includes them.
    """
    k = match.shape[0]
    # positions up to and including the first reject, found on the device: the counts below are read
    # together, one device-to-host transfer per round instead of one per counter
    n = accept.to(torch.int64).cumprod(0).sum()
    upto = torch.arange(k, device=match.device) <= n
    miss = ~match & upto
    gate = gate_open(entropy[:k], theta)
    window = window_clear(match, window_size)
    bound = within_boundary(k, window_size, match.device, num_draft_tokens)
    deferred = miss & accept
    hard = miss & ~gate
    window_rej = miss & gate & ~window
    bound_rej = miss & gate & window & ~bound
    names, masks = list(FLY_COUNTERS), [miss, deferred, hard, window_rej, bound_rej]  # FLY_COUNTERS' order
    if copy is not None:
        names.append(FLY_GUARD_COUNTERS[0])
        masks.append(miss & gate & window & bound & copy)
    counts = torch.stack([m.sum() for m in masks]).tolist()
    return dict(zip(names, counts))


def fly_verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor, theta: float = THETA,
                      window_size: int = WINDOW, top_k: int = TOP_K, num_draft_tokens: int | None = None,
                      copy: torch.Tensor | None = None) -> Verdict:
    """FLy on greedy targets (LOSSY). draft_tokens: [k]; target_logits: [k + 1, V]; ``num_draft_tokens``:
    the nominal K the boundary follows (default: the draft's length); ``copy``: the copy guard's [k] mask
    (:class:`PromptCopyGuard`), None for the paper's rule."""
    target_tokens = target_logits.argmax(-1)  # [K + 1]
    draft_tokens = draft_tokens.to(target_tokens.device)
    match = match_mask(draft_tokens, target_tokens)
    return _fly_verdict(match, draft_tokens, target_tokens, target_logits, theta, window_size, top_k,
                        num_draft_tokens, copy)


def fly_verify_two_sample(draft_tokens: torch.Tensor, target_logits: torch.Tensor, target_probs: torch.Tensor,
                          generator: torch.Generator | None, theta: float = THETA, window_size: int = WINDOW,
                          top_k: int = TOP_K, num_draft_tokens: int | None = None,
                          copy: torch.Tensor | None = None) -> Verdict:
    """FLy as in the official code for T > 0 (LOSSY even before loosening).

    A draft token matches when it equals either of two samples from the target's distribution;
    the emitted correction or bonus is the first sample.
    target_logits: [K + 1, V] raw (for the entropy); target_probs: [K + 1, V] after
    temperature/top-k/top-p.
    """
    draft_tokens = draft_tokens.to(target_probs.device)
    k = draft_tokens.shape[0]
    first, second = sample(target_probs, generator), sample(target_probs, generator)  # [K + 1] each
    match = (draft_tokens == first[:k]) | (draft_tokens == second[:k])
    return _fly_verdict(match, draft_tokens, first, target_logits, theta, window_size, top_k, num_draft_tokens,
                        copy)


def fly_verify_rejection(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
                         target_probs: torch.Tensor, generator: torch.Generator | None, theta: float = THETA,
                         window_size: int = WINDOW, top_k: int = TOP_K, num_draft_tokens: int | None = None,
                         copy: torch.Tensor | None = None) -> Verdict:
    """FLy layered on rejection sampling (LOSSY): natively rejected positions may be deferred.

    ``E_j`` = native acceptance ``u_j < p_j(d_j) / q_j(d_j)`` (each position with its own ``u``);
    deferral as in :func:`fly_mask`; the correction at the first final reject is drawn from
    ``normalize(max(0, p - q))`` as in lossless rejection sampling, the bonus from ``p_K``.
    """
    device = target_probs.device
    draft_tokens = draft_tokens.to(device)
    draft_probs = draft_probs.to(device) if draft_probs is not None else None
    match = native_accept(draft_tokens, draft_probs, target_probs, generator)
    accept, events = fly_accept(match, target_logits, theta, window_size, top_k, num_draft_tokens, copy)
    n = first_false(accept)
    nxt = next_token(n, draft_tokens, draft_probs, target_probs, generator)
    return Verdict(n, torch.cat([draft_tokens[:n], nxt]), events)


def fly_accept(match: torch.Tensor, target_logits: torch.Tensor, theta: float = THETA, window_size: int = WINDOW,
               top_k: int = TOP_K, num_draft_tokens: int | None = None,
               copy: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, int]]:
    """FLy's acceptance mask over any match mask ([K] bool: exact match, two-sample match or native
    rejection-sampling acceptance), and the round's counters. ``target_logits``: [>= K, V] raw logits,
    for the entropy gate; ``copy``: the copy guard's mask (None: off). Every engine's FLy (this one's rules,
    the vLLM plugin) goes through here."""
    entropy = topk_entropy(target_logits[: match.shape[0]], top_k)
    accept = fly_mask(match, entropy, theta, window_size, num_draft_tokens, copy)
    return accept, fly_events(match, entropy, theta, window_size, accept, num_draft_tokens, copy)


def _fly_verdict(match, draft_tokens, target_tokens, target_logits, theta, window_size, top_k,
                 num_draft_tokens=None, copy=None) -> Verdict:
    accept, events = fly_accept(match, target_logits, theta, window_size, top_k, num_draft_tokens, copy)
    return replace(prefix_verdict(accept, draft_tokens, target_tokens), events=events)
