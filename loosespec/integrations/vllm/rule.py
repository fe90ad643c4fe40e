"""FLy on vLLM's verification tensors (LOSSY): the adapter between vLLM's batch layout and
:mod:`loosespec.verify.fly`, the same rule functions the transformers engine uses.

vLLM (V1 model runner) verifies a whole batch at once: the drafts of all requests are flattened into
``draft_token_ids`` ([num_tokens]), request ``i`` owning ``[cu_num_draft_tokens[i-1],
cu_num_draft_tokens[i])`` (``num_draft_tokens[i]`` may be 0); ``target_logits`` has one row per
draft token (the row that predicts it), ``bonus_token_ids`` ([batch, 1]) the token each request
emits after a fully accepted draft (vLLM samples it beforehand), and the output is ``[batch,
max_spec_len + 1]`` int32, each row the kept draft prefix plus one correction or bonus token, then
``-1`` padding.

Per request, greedy (``is_greedy[i]``, temperature 0) or sampled:

- greedy: ``E_j = (d_j == argmax z_j)``; correction ``argmax z_n``.
- sampled: ``E_j`` = native rejection-sampling acceptance ``u_j < p_j(d_j) / q_j(d_j)`` (``q`` one-hot
  when the drafter gives no distribution: n-gram), ``p`` the softmax of vLLM's processed logits
  (temperature, top-k, top-p); correction from ``normalize(max(0, p_n - q_n))``, drawn with the
  request's own generator when it has a seed.
- then FLy's mask over ``E`` (:func:`loosespec.verify.fly.fly_accept`): gate on the entropy of the
  *raw* logits' top-k probabilities, deferred window, boundary; keep the prefix up to the first
  final reject.

The settings mean what vLLM's native FLy means by them (``fly_window_size``: the positions *after* a
mismatch that must be natively accepted, below K), and unset ones take vLLM's native defaults
(:func:`resolve`: theta 0.3, ``W = min(6, K - 1)``, the window boundary), so a ``speculative_config`` that
runs on a vLLM with native FLy asks the plugin for the same rule.

Each request is ruled on independently, as in the transformers engine, in a Python loop over the
batch (a handful of small tensor ops per request; a fused kernel would remove the per-request
host round trips on a GPU). On the V2 runner's layout an all-greedy batch skips the loop: it is ruled
on the padded ``[batch, K]`` layout with one device-to-host read (``_fly_v2_padded``, tested equal to
the per-request path); batches with sampled requests take the loop unless ``sampled_path="padded"``
(counter-based draws: equal in distribution, not draw for draw; opt-in until measured on a GPU).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

import torch

from loosespec.config import VLLM_KNOBS, knob_default, knob_type, validate_knob
from loosespec.verify.exact import first_false
from loosespec.verify.fly import FLY_COUNTERS, FLY_OFFICIAL_COUNTERS, FLY_ROUND_COUNTERS, fly_accept
from loosespec.verify.rejection import native_accept, next_token
from loosespec.verify.sampling import sample

PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID
ENV_PREFIX = "LOOSESPEC_"
COUNTERS = FLY_COUNTERS + FLY_OFFICIAL_COUNTERS + FLY_ROUND_COUNTERS
# vLLM's native FLy defaults, for the settings left unset (its fly_window_size default is min(6, K - 1))
VLLM_NATIVE = {"fly_entropy_threshold": 0.3, "fly_window_size": 6, "fly_boundary": "window"}


def _validate(self) -> None:
    for f in dataclasses.fields(self):  # ConfigError is a ValueError naming the field
        validate_knob(f.name, getattr(self, f.name))


def _parse_env(name: str, raw: str):
    kind = knob_type(name)
    args = [a for a in getattr(kind, "__args__", ()) if a is not type(None)]
    if args and type(None) in getattr(kind, "__args__", ()):  # Optional[X]: an unset knob (vLLM's default)
        kind = args[0]
    if kind is bool:
        if raw.strip().lower() not in ("1", "0", "true", "false"):
            raise ValueError(f"{ENV_PREFIX}{name.upper()} must be true or false, got {raw!r}")
        return raw.strip().lower() in ("1", "true")
    try:
        return kind(raw)
    except ValueError:
        what = {int: "n integer", float: " number"}.get(kind, " " + getattr(kind, "__name__", "value"))
        raise ValueError(f"{ENV_PREFIX}{name.upper()} must be a{what}, got {raw!r}") from None


def _from_env(cls, environ: Mapping[str, str] = os.environ):
    """The settings ``LOOSESPEC_*`` variables ask for, or None when FLy is not enabled."""
    method = environ.get(ENV_PREFIX + "REJECTION_SAMPLE_METHOD", "standard").strip().lower()
    if method in ("", "standard"):
        return None
    if method != "fly":
        raise ValueError(f"{ENV_PREFIX}REJECTION_SAMPLE_METHOD must be 'fly' or 'standard', got {method!r}")
    kwargs = {}
    for name in VLLM_KNOBS:
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is not None and raw.strip():
            kwargs[name] = _parse_env(name, raw)
    return cls(**kwargs)


def fly_env(values: Mapping[str, object]) -> dict[str, str]:
    """The environment that asks the plugin for FLy with these settings (what :meth:`FlySettings.from_env` reads)."""
    env = {ENV_PREFIX + "REJECTION_SAMPLE_METHOD": "fly"}
    for name in VLLM_KNOBS:
        if values.get(name) is not None:  # unset: the plugin takes vLLM's native default
            v = values[name]
            env[ENV_PREFIX + name.upper()] = repr(v) if isinstance(v, float) else str(v)
    return env


# FLy's parameters under vLLM's (upstream pull request's) names: the knobs loosespec.config marks vllm=True,
# with their declared types, defaults and bounds (adding such a knob adds it here and to LOOSESPEC_<NAME>)
FlySettings = dataclasses.make_dataclass(
    "FlySettings",
    [(n, knob_type(n), dataclasses.field(default=knob_default(n))) for n in VLLM_KNOBS],
    frozen=True,
    namespace={
        "__post_init__": _validate,
        "from_env": classmethod(_from_env),
        "__doc__": "FLy's settings in the vLLM plugin: loosespec's knobs marked vllm=True.",
    },
)
FlySettings.__module__ = __name__


def resolve(settings, k: int) -> tuple[float, int, int, str]:
    """(theta, W, top_k, boundary) for drafts of up to ``k`` tokens (vLLM's num_speculative_tokens): the settings
    given, vLLM's native defaults for those left unset. A window of ``k`` or more positions never fits: refused,
    as vLLM refuses ``fly_window_size >= num_speculative_tokens``."""
    theta = settings.fly_entropy_threshold
    theta = VLLM_NATIVE["fly_entropy_threshold"] if theta is None else theta
    w = settings.fly_window_size
    if w is None:
        w = max(0, min(VLLM_NATIVE["fly_window_size"], k - 1))
    elif k and w >= k:
        raise ValueError(
            f"fly_window_size ({w}) must be smaller than num_speculative_tokens ({k}): FLy defers a "
            "mismatch only when the positions after it fit in the draft"
        )
    boundary = settings.fly_boundary or VLLM_NATIVE["fly_boundary"]
    return theta, w, settings.fly_entropy_top_k, boundary


def _target_probs(processed: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
    """Softmax of vLLM's processed logits; a row that top-k/top-p left without a finite logit (vLLM's own
    start-up profiling sends such rows: random logits, top-p 0.9) is no distribution, and falls back to the
    softmax of its unprocessed row instead of failing the draw."""
    probs = processed.float().softmax(-1)
    bad = ~torch.isfinite(probs).all(-1)
    if bool(bad.any()):
        probs[bad] = raw[bad].float().softmax(-1)
    return probs


def fly_rejection_sample(
    draft_token_ids: torch.Tensor,  # [num_tokens] int
    num_draft_tokens: Sequence[int],  # [batch]
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,  # [batch] inclusive cumulative sums
    draft_probs: torch.Tensor | None,  # [num_tokens, V] q, or None (n-gram: one-hot)
    target_logits: torch.Tensor,  # [num_tokens, V] vLLM's processed logits (raw for greedy requests)
    bonus_token_ids: torch.Tensor,  # [batch, 1]
    is_greedy: torch.Tensor | None,  # [batch] bool; None: every request is greedy
    settings: FlySettings,
    raw_logits: torch.Tensor | None = None,  # [num_tokens, V] before temperature/top-k/top-p; None: target_logits
    uniform_probs: torch.Tensor | None = None,  # [num_tokens] rejection-sampling draws; None: drawn here
    generators: Mapping[int, torch.Generator] | None = None,  # request index -> its seeded generator
) -> tuple[torch.Tensor, dict[str, int]]:
    """vLLM-shaped FLy verification: ``([batch, max_spec_len + 1] int32 padded with -1, counters)``."""
    batch = len(num_draft_tokens)
    device = target_logits.device
    out = torch.full((batch, max_spec_len + 1), PLACEHOLDER, dtype=torch.int32, device=device)
    raw = target_logits if raw_logits is None else raw_logits
    ends = cu_num_draft_tokens.tolist()
    greedy_rows = [True] * batch if is_greedy is None else is_greedy.tolist()
    generators = generators or {}
    totals = dict.fromkeys(COUNTERS, 0)
    theta, w, top_k, boundary = resolve(settings, max_spec_len)
    start = 0
    for i in range(batch):
        end = int(ends[i])
        k = end - start
        if k != int(num_draft_tokens[i]):
            raise ValueError(
                f"request {i}: cu_num_draft_tokens gives {k} draft tokens, num_draft_tokens {num_draft_tokens[i]}"
            )
        draft = draft_token_ids[start:end].long()
        bonus = bonus_token_ids[i].reshape(-1)[:1].long()
        if k == 0:
            out[i, 0] = bonus[0]
            start = end
            continue
        if greedy_rows[i]:
            target = target_logits[start:end].argmax(-1)
            match = draft == target
        else:
            probs = _target_probs(target_logits[start:end], raw[start:end])
            q = draft_probs[start:end].float() if draft_probs is not None else None
            gen = generators.get(i)
            if settings.fly_sampling == "two-sample":  # the official code's match: either of two target draws
                first, second = sample(probs, gen), sample(probs, gen)  # [k] each
                match = (draft == first) | (draft == second)
            else:
                u = uniform_probs[start:end] if uniform_probs is not None else None
                match = native_accept(draft, q, probs, gen, uniform=u)
        accept, events = fly_accept(match, raw[start:end], theta, w, top_k, boundary=boundary)
        n = first_false(accept)
        if n == k:
            nxt = bonus
        elif greedy_rows[i]:
            nxt = target[n : n + 1]
        elif settings.fly_sampling == "two-sample":
            nxt = first[n : n + 1]  # the correction is the first draw, as in the engine's two-sample rule
        else:
            nxt = next_token(n, draft, q, probs, gen)
        out[i, :n] = draft[:n].to(torch.int32)
        out[i, n] = nxt[0].to(torch.int32)
        for name in COUNTERS:
            totals[name] += events[name]
        start = end
    return out, totals


def _request_generator(seed: int, pos: int, device) -> torch.Generator:
    """A generator for one request's verification step, fixed by its seed and position (as vLLM's V2 runner
    draws ``tl_rand32(seed, pos)``): a seeded request verifies the same way every time."""
    gen = torch.Generator(device=device)
    gen.manual_seed((int(seed) * 1_000_003 + int(pos)) % (2**63 - 1))
    return gen


def fly_rejection_sample_v2(
    target_logits: torch.Tensor,  # [num_logits, V] processed (penalties, temperature, top-k/top-p)
    raw_logits: torch.Tensor,  # [num_logits, V] before processing: FLy's gate reads these
    draft_logits: torch.Tensor | None,  # [max_num_reqs, num_speculative_steps, V] pre-temperature; None: one-hot
    draft_sampled: torch.Tensor,  # [num_logits] the input token of each logits row; -1: placeholder draft
    cu_num_logits: torch.Tensor,  # [num_reqs + 1]
    pos: torch.Tensor,  # [num_logits]
    idx_mapping: torch.Tensor,  # [num_reqs] batch index -> request-state index
    temperature: torch.Tensor,  # [max_num_reqs]; 0: greedy
    seed: torch.Tensor,  # [max_num_reqs]
    num_speculative_steps: int,
    settings: FlySettings,
    vectorized: bool = True,  # an all-greedy batch ruled on the padded [batch, K] layout (False: per request)
    sampled_path: str = "per-request",  # a batch with sampled requests: "per-request" | "padded" (counter draws)
) -> tuple[torch.Tensor, torch.Tensor, dict[str, int]]:
    """FLy on vLLM's V2 model runner layout (the GPU default): ``(sampled [num_reqs, k + 1] int64,
    num_sampled [num_reqs] int32, counters)``.

    V2 gives request ``r`` the logits rows ``[cu[r], cu[r+1])``: row ``cu[r] + j`` verifies the draft
    token in ``draft_sampled[cu[r] + j + 1]`` and the last row yields the bonus token. This function only
    re-lays the batch out as the V1 runner does (flattened drafts, bonus tokens drawn beforehand, ``q`` as
    probabilities) and rules through :func:`fly_rejection_sample`, so both runners apply one rule. A ``-1``
    placeholder draft and everything after it are rejected, as V2's own kernel does.

    ``sampled_path="padded"`` rules a batch with sampled requests on the padded layout too (issue 22, 8: no
    per-request loop, no ``.tolist()``), drawing from a counter-based generator keyed by each request's seed
    and position: the same distribution as the per-request path, not the same draws, so it stays opt-in
    (``LOOSESPEC_V2_SAMPLED_PATH=padded`` in the plugin) until a GPU measures it faster.
    """
    if sampled_path not in ("per-request", "padded"):
        raise ValueError(f"sampled_path must be 'per-request' or 'padded', got {sampled_path!r}")
    device = target_logits.device
    if vectorized:
        all_greedy = bool((temperature[idx_mapping] == 0).all())  # one read: is the whole batch greedy?
        if all_greedy or sampled_path == "padded":
            return _fly_v2_padded(
                target_logits,
                raw_logits,
                draft_logits,
                draft_sampled,
                cu_num_logits,
                pos,
                idx_mapping,
                temperature,
                seed,
                num_speculative_steps,
                settings,
                all_greedy,
            )
    cu = cu_num_logits.tolist()
    states = idx_mapping.tolist()
    temps = temperature.float().tolist()
    seeds = seed.tolist()
    num_reqs = len(cu) - 1
    keep_rows: list[torch.Tensor] = []  # logits rows that verify a draft token
    draft_ids: list[torch.Tensor] = []
    q_rows: list[torch.Tensor] = []
    bonus, counts, greedy, generators = [], [], [], {}
    for r in range(num_reqs):
        lo, hi = int(cu[r]), int(cu[r + 1])
        drafts = draft_sampled[lo + 1 : hi].long()
        invalid = (drafts < 0).nonzero()
        k = int(invalid[0, 0]) if len(invalid) else len(drafts)  # drafts from a placeholder on are rejected
        state, temp = int(states[r]), float(temps[states[r]])
        is_greedy = temp == 0.0
        greedy.append(is_greedy)
        counts.append(k)
        keep_rows.append(torch.arange(lo, lo + k, device=device))
        draft_ids.append(drafts[:k])
        last = target_logits[lo + k]
        if is_greedy:
            bonus.append(last.argmax().view(1))
        else:
            gen = _request_generator(seeds[state], int(pos[lo]), device)
            generators[r] = gen
            probs = _target_probs(last.view(1, -1), raw_logits[lo + k].view(1, -1))[0]
            bonus.append(torch.multinomial(probs, 1, generator=gen))
        if draft_logits is not None and k:  # greedy rows never read q: zeros keep the flattened layout whole
            q_rows.append(
                torch.zeros(k, draft_logits.shape[-1], device=device)
                if is_greedy
                else (draft_logits[state, :k].float() / temp).softmax(-1)
            )
    rows = torch.cat(keep_rows) if keep_rows else torch.zeros(0, dtype=torch.long, device=device)
    vocab = target_logits.shape[-1]
    q = None
    if draft_logits is not None:
        q = torch.cat(q_rows) if q_rows else torch.zeros(0, vocab, device=device)
        if q.shape[-1] < vocab:  # a draft vocabulary padded shorter than the target's
            q = torch.nn.functional.pad(q, (0, vocab - q.shape[-1]))
    out, events = fly_rejection_sample(  # sampled requests draw their uniforms from their own generators
        torch.cat(draft_ids) if draft_ids else torch.zeros(0, dtype=torch.long, device=device),
        counts,
        num_speculative_steps,
        torch.tensor(counts, dtype=torch.long).cumsum(0),
        q,
        target_logits[rows],
        torch.cat(bonus).view(-1, 1),
        torch.tensor(greedy, dtype=torch.bool),
        settings,
        raw_logits=raw_logits[rows],
        generators=generators,
    )
    num_sampled = (out >= 0).sum(-1).to(torch.int32)
    return out.long(), num_sampled, events


# the V2 batch's sampled requests on the padded layout (``sampled_path="padded"``) draw from a counter-based
# generator: each uniform is a hash of (request seed, row position, stream), as vLLM's own kernels draw
# tl_rand32(seed, pos), so a seeded request verifies the same way every time with no generator per request
_M32 = 0xFFFFFFFF
_ACCEPT, _FIRST, _SECOND, _NEXT = range(4)  # streams: native acceptance, two-sample draws, correction/bonus


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for ``x`` in ``[0, 2**32)`` held in int64, in halves so no product overflows."""
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xorshift-multiply rounds, "lowbias32") on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def counter_uniform(seed: torch.Tensor, pos: torch.Tensor, stream: int) -> torch.Tensor:
    """Uniforms in (0, 1), float64, one per element of ``seed``/``pos`` (broadcast): a hash of the request's
    seed, the row's position and the stream, so the same request at the same position draws the same."""
    seed, pos = seed.long(), pos.long()
    h = _mix32((seed & _M32) ^ (stream * 0x9E3779B9 & _M32))
    h = _mix32(h ^ ((seed >> 32) & _M32))
    h = _mix32(h ^ (pos & _M32))
    return (h.double() + 0.5) / 2.0**32


def _draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs`` ([N, V], rows need not sum to 1) by inverse CDF at the uniforms ``u`` ([N])."""
    cdf = probs.float().cumsum(-1)
    v = (u.to(cdf.dtype) * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, v).squeeze(-1).clamp(max=probs.shape[-1] - 1)


def _fly_v2_padded(
    target_logits: torch.Tensor,
    raw_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_sampled: torch.Tensor,
    cu_num_logits: torch.Tensor,
    pos: torch.Tensor,
    idx_mapping: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    k_max: int,
    settings: FlySettings,
    all_greedy: bool,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, int]]:
    """:func:`fly_rejection_sample_v2` on the padded ``[batch, K]`` layout, with no per-request loop and one
    device-to-host read (the counters): greedy requests by the same rule as the per-request path (tested equal),
    sampled ones with the counter-based draws above (equal in distribution, not draw for draw).

    Request ``r``'s drafts are ``draft_sampled[cu[r] + 1 + j]`` for ``j < k_r``, ``k_r`` its drafts up to the
    first ``-1`` placeholder; row ``cu[r] + j`` predicts draft ``j`` and row ``cu[r] + n`` gives the token
    after the kept prefix of length ``n`` (the correction, or the bonus when ``n == k_r``)."""
    from loosespec.verify.fly import gate_open, topk_entropy

    device = target_logits.device
    cu = cu_num_logits.to(device=device, dtype=torch.long)
    num_rows = target_logits.shape[0]
    starts = cu[:-1]  # [R]
    j = torch.arange(k_max, device=device)  # [K]
    rows = starts[:, None] + j[None, :]  # [R, K] the row predicting draft j
    slots = (cu[1:] - starts - 1)[:, None] > j[None, :]  # draft positions the layout holds
    drafts = draft_sampled.to(device).long()[(rows + 1).clamp(max=num_rows - 1)]
    k = (slots & (drafts >= 0)).long().cumprod(1).sum(1)  # [R] drafts before the first placeholder
    valid = j[None, :] < k[:, None]
    choice = target_logits.argmax(-1)  # [rows]
    safe = rows.clamp(max=num_rows - 1)
    match = drafts == choice[safe]
    sampled = None
    if not all_greedy:
        sampled = _v2_sampled(
            target_logits, raw_logits, draft_logits, drafts, safe, starts, pos, idx_mapping, temperature, seed, settings
        )
        match = torch.where(sampled["greedy"][:, None], match, sampled["match"])
    match = match & valid
    theta, w, top_k, boundary = resolve(settings, k_max)
    entropy = topk_entropy(raw_logits, top_k)[safe]  # [R, K]
    gate = gate_open(entropy, theta)
    misses = torch.cat([torch.zeros_like(k)[:, None], ((~match) & valid).long().cumsum(1)], 1)  # [R, K + 1]
    lo = torch.minimum(j[None, :] + 1, k[:, None])
    hi = torch.minimum(j[None, :] + w + 1, k[:, None])  # the window j+1 .. j+W, cut at the request's draft end
    window = (misses.gather(1, hi) - misses.gather(1, lo)) == 0
    # the boundary of a draft of k_r tokens (nominal K = k_r): the window fits, or one stricter (official)
    bound = j[None, :] <= (k - w - (2 if boundary == "official" else 1))[:, None]
    accept = (match | (gate & window & bound)) & valid
    n = accept.long().cumprod(1).sum(1)  # [R] kept draft tokens
    nxt = choice[(starts + n).clamp(max=num_rows - 1)]
    if sampled is not None:
        nxt = torch.where(sampled["greedy"], nxt, sampled["next"](n, k))
    out = torch.full((len(k), k_max + 1), PLACEHOLDER, dtype=torch.long, device=device)
    keep = j[None, :] < n[:, None]
    out[:, :k_max] = torch.where(keep, drafts, out[:, :k_max])
    out.scatter_(1, n[:, None], nxt[:, None])
    upto = (j[None, :] <= n[:, None]) & valid
    miss = ~match & upto
    initial = ~match & valid
    counts = torch.stack(
        [
            miss.sum(),
            (miss & accept).sum(),
            (miss & ~gate).sum(),
            (miss & gate & ~window).sum(),
            (miss & gate & window & ~bound).sum(),
            initial.sum(),
            (initial & gate & window & bound).sum(),
            (bound & valid).any(1).sum(),
        ]
    ).tolist()
    return out, (n + 1).to(torch.int32), dict(zip(COUNTERS, counts))  # in COUNTERS' order


def _v2_sampled(
    target_logits, raw_logits, draft_logits, drafts, safe, starts, pos, idx_mapping, temperature, seed, settings
) -> dict:
    """The sampled requests' part of :func:`_fly_v2_padded`, for every request of the batch at once (greedy ones
    are taken from the greedy rule by the caller): ``greedy`` [R] bool, ``match`` [R, K] (either of two draws
    for ``two-sample``, native acceptance ``u < p(d) / q(d)`` for ``rejection``) and ``next(n, k)``, the token
    after a kept prefix of ``n`` (the first draw there for ``two-sample``; for ``rejection`` a draw from
    ``normalize(max(0, p_n - q_n))``, or from ``p`` at the bonus row when the whole draft is kept)."""
    device = target_logits.device
    num_rows, vocab = target_logits.shape
    states = idx_mapping.to(device).long()
    temp = temperature.to(device).float()[states]  # [R]
    greedy = temp == 0
    row_req = torch.searchsorted(starts, torch.arange(num_rows, device=device), right=True) - 1  # [rows] its request
    row_seed = seed.to(device).long()[states][row_req]
    row_pos = pos.to(device).long()
    probs = _target_probs(target_logits, raw_logits)  # [rows, V]
    d = drafts.clamp(min=0)
    if settings.fly_sampling == "two-sample":  # the official code's match: either of two target draws
        first = _draw(probs, counter_uniform(row_seed, row_pos, _FIRST))  # [rows]
        second = _draw(probs, counter_uniform(row_seed, row_pos, _SECOND))
        match = (d == first[safe]) | (d == second[safe])
        return {"greedy": greedy, "match": match, "next": lambda n, k: first[(starts + n).clamp(max=num_rows - 1)]}
    q = None
    if draft_logits is not None:  # q at the request's temperature (greedy rows never read it)
        z = draft_logits.to(device)[states].float()  # [R, K, V_draft]
        q = (z / torch.where(greedy, 1.0, temp)[:, None, None]).softmax(-1)
        if q.shape[-1] < vocab:  # a draft vocabulary padded shorter than the target's
            q = torch.nn.functional.pad(q, (0, vocab - q.shape[-1]))
        q = q[..., :vocab]
    p_d = probs[safe, d]
    q_d = q.gather(2, d[..., None]).squeeze(-1) if q is not None else torch.ones_like(p_d)
    u = counter_uniform(row_seed, row_pos, _ACCEPT)[safe]
    match = u.to(p_d.dtype) * q_d < p_d  # u < p/q without dividing by a tiny q

    def after(n: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        row = (starts + n).clamp(max=num_rows - 1)
        p_n = probs[row]  # [R, V]
        at = n.clamp(max=d.shape[1] - 1)[:, None]
        q_n = (
            q.gather(1, at[..., None].expand(-1, 1, vocab)).squeeze(1)
            if q is not None
            else torch.nn.functional.one_hot(d.gather(1, at).squeeze(1), vocab).to(p_n.dtype)
        )
        residual = (p_n - q_n).clamp(min=0.0)
        total = residual.sum(-1, keepdim=True)
        # p == q up to rounding leaves no residual mass: p itself is then the exact distribution
        dist = torch.where(total > 0, residual, p_n)
        dist = torch.where((n < k)[:, None], dist, p_n)  # the whole draft kept: the bonus, from p
        return _draw(dist, counter_uniform(row_seed[row], row_pos[row], _NEXT))

    return {"greedy": greedy, "match": match, "next": after}
