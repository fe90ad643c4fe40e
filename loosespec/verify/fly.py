"""FLy: training-free loosely speculative verification (LOSSY by design).

FLy keeps a mismatching draft token when the target was uncertain at that position (entropy
gate) and the draft "stays on track" afterwards (deferred window): the output is no longer the
target's own output, and every speed claim made with it must be paired with an accuracy
measurement. Spec: ``methods.md`` §3.

Given draft ``d[0..K-1]`` and the target's choice ``t[0..K]`` (argmax when greedy), start from the
exact-match mask ``E_j = (d_j == t_j)``. A mismatch at ``j`` is *deferred* (the draft token kept) iff

1. **gate**: ``H_j >= theta``, with ``H_j`` the entropy of the target's top-k probabilities
   (k = ``fly_entropy_top_k`` = 3; probabilities from the full softmax, not renormalised; natural
   log, so ``0 <= H <= ln 3``). ``theta = 0`` opens the gate always. A theta in (0, 0.01] is refused
   here as everywhere (:func:`fly_theta_problem`: the official code turns its gate off
   there). A mismatch with ``H_j < theta`` is a *hard reject* (the target is confident).
2. **window**: the ``W`` positions after it, ``j+1 .. j+W``, are all exact matches. ``W =
   fly_window_size`` counts the positions *after* the mismatch: vLLM's meaning ("the number of
   subsequent native acceptance decisions checked") and the paper's prose ("the next W tokens").
   The official code's ``W = 6`` counts the mismatch itself: it is ``W = 5`` here. (Results written
   before 2026-12-04 used the official code's count; every result's config records the meaning,
   ``fly_window_meaning``.)
3. **boundary** (``fly_boundary``): ``window`` (vLLM's native FLy) defers only where the window fits
   inside the draft, ``j + W < k``; ``official`` (the official code) is one position stricter,
   ``j <= K - W - 2`` for the nominal K (and the window inside the draft when a round drafts fewer).

Mismatches inside another mismatch's window are ordinary (the window is judged on ``E``, never on
other deferrals). Final mask ``A = E or deferred``; the verdict keeps ``d[0:n]`` for the first
``n`` with ``A_n`` False and emits ``t_n`` (correction) or, if all are kept, ``t_K`` (bonus).

Worked example (K = 15, W = 5, theta = 0.3)::

    E = T T F T T T T T T F T T T T T      H_2 = 0.5, H_9 = 0.8
    j = 2: gate open, window 3..7 all match             -> deferred under either boundary
    j = 9: gate open, window 10..14 all match
           boundary window:   9 + 5 < 15                 -> deferred: all 15 kept + the bonus (16 tokens)
           boundary official: 9 > 15 - 5 - 2 = 8         -> rejected: d[0..8] kept + t_9 (10 tokens)

Each condition is a separate function returning a ``[K]`` bool mask and :func:`loose_mask`
composes any of them, so ablations are compositions: ``window only`` = ``loose_mask(E, window,
boundary)``, ``gate only`` = ``loose_mask(E, gate)``.

Counters per round (:func:`fly_events`): loosespec's prefix counters (the mismatches the rule ruled
on, up to the first final reject, each attributed to the first condition it fails), the official
code's counters over all K positions (``fly_initial_mismatches`` before the gate, ``fly_window_rescues``
that gate, window and boundary would keep: the paper's FLy accept rate is their ratio), and
``fly_deferrable_rounds`` (the draft was long enough to defer anywhere).

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

from loosespec.verify.exact import first_false, match_mask, prefix_verdict
from loosespec.verify.rejection import native_accept, next_token
from loosespec.verify.sampling import sample
from loosespec.verify.types import FirstMiss, Verdict

# FLy's per-round counters (fly_events), per draft position seen by the rule
FLY_COUNTERS = (
    "fly_prefix_mismatches",
    "fly_deferred",
    "fly_hard_rejects",
    "fly_window_rejects",
    "fly_boundary_rejects",
)
# the official FLy code's counters, over all K draft positions (not only up to the first reject): mismatches before
# the gate, and the mismatches gate, window and boundary would keep; the paper's FLy accept rate is their ratio
FLY_OFFICIAL_COUNTERS = ("fly_initial_mismatches", "fly_window_rescues")
# rounds whose draft was long enough for the rule to defer anywhere in it (what the draft length let FLy do)
FLY_ROUND_COUNTERS = ("fly_deferrable_rounds",)
# counted only with FLy's copy guard on (DecodeConfig.fly_copy_guard, a labeled variant): mismatches it refused
FLY_GUARD_COUNTERS = ("fly_copy_rejects",)
# FLy's deferral boundary (DecodeConfig.fly_boundary): "window", a mismatch may be deferred where its window of
# fly_window_size later positions fits inside the draft (vLLM's native FLy); "official", one position stricter, as
# the official FLy code bounds it (j <= K - W - 2 with W counting the positions after the mismatch)
FLY_BOUNDARIES = ("window", "official")
# what fly_window_size counts, recorded in every result's config: "subsequent" positions after the mismatch (vLLM's
# meaning, since 2026-12-04); results written before lack the key and counted the mismatch itself (W + 1)
FLY_WINDOW_MEANING = "subsequent"


def fly_theta_problem(theta: float | None) -> str | None:
    """Why an entropy threshold is refused, or None. One rule for every entry point (the configuration, the rule
    functions here, the vLLM plugin): the official FLy code turns its gate off for any theta in
    (0, 0.01], where the rule as written would gate at that entropy; rather than guess which was meant, refuse."""
    if theta is not None and 0.0 < theta <= 0.01:
        return (
            f"= {theta!r} is ambiguous: the official FLy code turns the entropy gate off for any theta in "
            "(0, 0.01], this one would gate at that entropy; pass 0 to turn the gate off, or a value above 0.01"
        )
    return None


# the rule functions' defaults for callers that pass none: vLLM's native FLy (whose W default is min(6, K - 1))
THETA, WINDOW, TOP_K, BOUNDARY = 0.3, 6, 3, "window"


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
    """[K] True where the target is uncertain enough for a mismatch to be deferred (``H_j >= theta``).
    A theta in (0, 0.01] is refused (ValueError), as by the configuration."""
    problem = fly_theta_problem(theta)
    if problem:
        raise ValueError(f"fly_entropy_threshold {problem}")
    return entropy >= theta


def window_clear(match: torch.Tensor, window_size: int) -> torch.Tensor:
    """[K] True where the ``W`` positions after ``j``, ``j+1 .. j+W``, that lie inside the draft are all exact
    matches (``W = 0``: nothing after the mismatch is checked).

    Whether the window fits inside the draft at all is :func:`within_boundary`'s business.
    """
    k = match.shape[0]
    miss = torch.cat([torch.zeros(1, dtype=torch.long, device=match.device), (~match).long().cumsum(0)])  # [K+1]
    j = torch.arange(k, device=match.device)
    lo = (j + 1).clamp(max=k)
    hi = (j + window_size + 1).clamp(max=k)  # exclusive end of the window, cut at the draft's end
    return (miss[hi] - miss[lo]) == 0


def within_boundary(
    k: int,
    window_size: int,
    device: torch.device | str = "cpu",
    num_draft_tokens: int | None = None,
    boundary: str = BOUNDARY,
) -> torch.Tensor:
    """[k] True where a mismatch may be deferred in a draft of length k.

    ``window`` (vLLM's native FLy): the window ``j+1 .. j+W`` fits inside the draft, ``j + W < k``.
    ``official`` (the official FLy code): ``j <= K - W - 2`` for the nominal draft length K
    (``num_draft_tokens``, FLy's K = 15; default: the draft's own length), one position stricter than the
    window needs; a draft cut shorter than K (the cost-aware draft length, an end token, the token budget)
    also needs the window inside it: ``j <= min(K - W - 2, k - W - 1)``. Either way a draft of k <= W tokens
    never defers.
    """
    if boundary not in FLY_BOUNDARIES:
        raise ValueError(f"fly_boundary must be one of {', '.join(FLY_BOUNDARIES)}, got {boundary!r}")
    bound = k - window_size - 1
    if boundary == "official":
        nominal = k if num_draft_tokens is None else max(num_draft_tokens, k)
        bound = min(nominal - window_size - 2, bound)
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
        self.grams = frozenset(tuple(ids[i : i + n]) for i in range(len(ids) - n + 1))

    def __call__(self, draft_tokens: torch.Tensor) -> torch.Tensor:
        d, n = draft_tokens.tolist(), self.n
        hits = [j + n <= len(d) and tuple(d[j : j + n]) in self.grams for j in range(len(d))]
        return torch.tensor(hits, dtype=torch.bool, device=draft_tokens.device)


def loose_mask(match: torch.Tensor, *conditions: torch.Tensor) -> torch.Tensor:
    """``E or (not E and all conditions)``: accept a mismatch when every condition holds there."""
    deferred = ~match
    for c in conditions:
        deferred = deferred & c
    return match | deferred


def fly_mask(
    match: torch.Tensor,
    entropy: torch.Tensor,
    theta: float,
    window_size: int,
    num_draft_tokens: int | None = None,
    copy: torch.Tensor | None = None,
    boundary: str = BOUNDARY,
) -> torch.Tensor:
    """FLy's final acceptance mask: gate, window and boundary composed (see module docstring); with the copy
    guard's ``copy`` mask (:class:`PromptCopyGuard`), a mismatch that copies the prompt is not deferred."""
    return _conditions(match, entropy, theta, window_size, num_draft_tokens, copy, boundary)[0]


def _conditions(match, entropy, theta, window_size, num_draft_tokens, copy, boundary):
    """(final mask, gate, window, boundary): the conditions composed once, for the mask and the counters."""
    k = match.shape[0]
    gate = gate_open(entropy[:k], theta)
    window = window_clear(match, window_size)
    bound = within_boundary(k, window_size, match.device, num_draft_tokens, boundary)
    conditions = [gate, window, bound] + ([~copy] if copy is not None else [])
    return loose_mask(match, *conditions), gate, window, bound


def fly_events(
    match: torch.Tensor,
    entropy: torch.Tensor,
    theta: float,
    window_size: int,
    accept: torch.Tensor,
    num_draft_tokens: int | None = None,
    copy: torch.Tensor | None = None,
    boundary: str = BOUNDARY,
) -> dict[str, int]:
    """The round's counters (see the module docstring for what each counts).

    ``fly_prefix_mismatches`` = deferred + hard (gate) + window + boundary rejects, over the mismatches up to
    the first final reject, a rejected mismatch attributed to the first condition it fails in that order (the
    name was ``fly_mismatches`` in results written before 2026-12-01). With the copy guard on (``copy`` given)
    ``fly_copy_rejects`` counts the mismatches that passed gate, window and boundary and that only the guard
    refused; the sum above then includes them. ``fly_initial_mismatches`` and ``fly_window_rescues`` are the
    official code's, over all K positions; ``fly_deferrable_rounds`` is 1 when the draft admitted a deferral.
    """
    _, gate, window, bound = _conditions(match, entropy, theta, window_size, num_draft_tokens, copy, boundary)
    return _read_round(match, gate, window, bound, accept, copy)[0]


def _read_round(match, gate, window, bound, accept, copy) -> tuple[dict[str, int], FirstMiss | None]:
    """The counters and the first native rejection's :class:`FirstMiss`, read together: one device-to-host
    transfer per round instead of one per value."""
    k = match.shape[0]
    n = accept.to(torch.int64).cumprod(0).sum()  # positions up to and including the first reject
    upto = torch.arange(k, device=match.device) <= n
    miss = ~match & upto
    rescue = ~match & gate & window & bound & (~copy if copy is not None else True)
    names = list(FLY_COUNTERS) + list(FLY_OFFICIAL_COUNTERS)
    masks = [
        miss,
        miss & accept,
        miss & ~gate,
        miss & gate & ~window,
        miss & gate & window & ~bound,
        ~match,
        rescue,
    ]  # in the names' order
    if copy is not None:
        names.append(FLY_GUARD_COUNTERS[0])
        masks.append(miss & gate & window & bound & copy)
    first = match.to(torch.int64).cumprod(0).sum()  # natively accepted before the first native reject
    at = first.clamp(max=max(k - 1, 0))
    values = torch.stack(
        [m.sum() for m in masks]
        + [bound.any().long(), first]
        + ([gate[at].long(), bound[at].long(), accept[at].long()] if k else [])
    ).tolist()
    events = dict(zip(names, values))
    events[FLY_ROUND_COUNTERS[0]] = values[len(names)]
    pos = values[len(names) + 1]
    if pos >= k:
        return events, None
    g, b, a = values[len(names) + 2 :]
    return events, FirstMiss(pos, bool(g), bool(b), bool(a))


def fly_verify_greedy(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    theta: float = THETA,
    window_size: int = WINDOW,
    top_k: int = TOP_K,
    num_draft_tokens: int | None = None,
    copy: torch.Tensor | None = None,
    boundary: str = BOUNDARY,
) -> Verdict:
    """FLy on greedy targets (LOSSY). draft_tokens: [k]; target_logits: [k + 1, V]; ``num_draft_tokens``:
    the nominal K the official boundary follows (default: the draft's length); ``copy``: the copy guard's [k]
    mask (:class:`PromptCopyGuard`), None for the paper's rule."""
    target_tokens = target_logits.argmax(-1)  # [K + 1]
    draft_tokens = draft_tokens.to(target_tokens.device)
    match = match_mask(draft_tokens, target_tokens)
    return _fly_verdict(
        match, draft_tokens, target_tokens, target_logits, theta, window_size, top_k, num_draft_tokens, copy, boundary
    )


def fly_verify_two_sample(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
    theta: float = THETA,
    window_size: int = WINDOW,
    top_k: int = TOP_K,
    num_draft_tokens: int | None = None,
    copy: torch.Tensor | None = None,
    boundary: str = BOUNDARY,
) -> Verdict:
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
    return _fly_verdict(
        match, draft_tokens, first, target_logits, theta, window_size, top_k, num_draft_tokens, copy, boundary
    )


def fly_verify_rejection(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
    theta: float = THETA,
    window_size: int = WINDOW,
    top_k: int = TOP_K,
    num_draft_tokens: int | None = None,
    copy: torch.Tensor | None = None,
    boundary: str = BOUNDARY,
) -> Verdict:
    """FLy layered on rejection sampling (LOSSY): natively rejected positions may be deferred.

    ``E_j`` = native acceptance ``u_j < p_j(d_j) / q_j(d_j)`` (each position with its own ``u``);
    deferral as in :func:`fly_mask`; the correction at the first final reject is drawn from
    ``normalize(max(0, p - q))`` as in lossless rejection sampling, the bonus from ``p_K``.
    """
    device = target_probs.device
    draft_tokens = draft_tokens.to(device)
    draft_probs = draft_probs.to(device) if draft_probs is not None else None
    match = native_accept(draft_tokens, draft_probs, target_probs, generator)
    accept, events, miss = fly_judge(match, target_logits, theta, window_size, top_k, num_draft_tokens, copy, boundary)
    n = first_false(accept)
    nxt = next_token(n, draft_tokens, draft_probs, target_probs, generator)
    return Verdict(n, torch.cat([draft_tokens[:n], nxt]), events, miss)


def fly_judge(
    match: torch.Tensor,
    target_logits: torch.Tensor,
    theta: float = THETA,
    window_size: int = WINDOW,
    top_k: int = TOP_K,
    num_draft_tokens: int | None = None,
    copy: torch.Tensor | None = None,
    boundary: str = BOUNDARY,
) -> tuple[torch.Tensor, dict[str, int], FirstMiss | None]:
    """FLy's acceptance mask over any match mask ([K] bool: exact match, two-sample match or native
    rejection-sampling acceptance), the round's counters, and its first native rejection (:class:`FirstMiss`,
    None when there was none). ``target_logits``: [>= K, V] raw logits, for the entropy gate; ``copy``: the copy
    guard's mask (None: off). Every engine's FLy (this one's rules, the vLLM plugin) goes through here."""
    entropy = topk_entropy(target_logits[: match.shape[0]], top_k)
    accept, gate, window, bound = _conditions(match, entropy, theta, window_size, num_draft_tokens, copy, boundary)
    events, miss = _read_round(match, gate, window, bound, accept, copy)
    return accept, events, miss


def fly_accept(
    match: torch.Tensor,
    target_logits: torch.Tensor,
    theta: float = THETA,
    window_size: int = WINDOW,
    top_k: int = TOP_K,
    num_draft_tokens: int | None = None,
    copy: torch.Tensor | None = None,
    boundary: str = BOUNDARY,
) -> tuple[torch.Tensor, dict[str, int]]:
    """:func:`fly_judge` without the first rejection: (acceptance mask, counters)."""
    return fly_judge(match, target_logits, theta, window_size, top_k, num_draft_tokens, copy, boundary)[:2]


def _fly_verdict(
    match,
    draft_tokens,
    target_tokens,
    target_logits,
    theta,
    window_size,
    top_k,
    num_draft_tokens=None,
    copy=None,
    boundary=BOUNDARY,
) -> Verdict:
    accept, events, miss = fly_judge(match, target_logits, theta, window_size, top_k, num_draft_tokens, copy, boundary)
    return replace(prefix_verdict(accept, draft_tokens, target_tokens), events=events, first_miss=miss)
