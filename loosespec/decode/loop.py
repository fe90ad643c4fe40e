"""The token-level decode loop: propose, verify in one target forward, rule, commit, repeat.

One loop serves every token-level method: ``ar`` is the same loop with no drafter (one target token per
round), so the speedup baseline is measured by the same code as the methods it is compared with. What varies
is passed in: the drafter (who proposes, :class:`~loosespec.drafters.base.Drafter`) and the rule (who decides,
:class:`~loosespec.verify.rules.Rule`). The engine (:mod:`loosespec.decode.engine`) builds both and runs this
loop; SpecGuard's step loop (:mod:`loosespec.decode.steps`) runs it for the steps the target writes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

import torch

from loosespec.decode.kv import CachedLM
from loosespec.decode.stats import Stats
from loosespec.drafters.base import EMPTY_DRAFT, Drafter
from loosespec.verify.rules import Rule
from loosespec.verify.sampling import check_finite


def decode(
    target: CachedLM,
    drafter: Drafter | None,
    rule: Rule,
    prompt_ids: torch.Tensor,  # [P] int64, CPU
    max_new_tokens: int,
    num_draft_tokens: int,
    stop_ids: Collection[int],
    stats: Stats,
) -> Iterator[list[int]]:
    """Yield committed token chunks until an end token or ``max_new_tokens``."""
    seq = prompt_ids
    produced = 0
    dtype = next(target.model.parameters()).dtype  # named in a non-finite-logits error
    target.prefill(seq[:-1])  # the prompt in a forward of its own, the same for every method (loosespec.quant)
    while produced < max_new_tokens:
        # 1. propose: at most K tokens, never more than the budget has room for (+1 target token)
        k = min(num_draft_tokens, max_new_tokens - produced - 1)
        proposed = drafter is not None and k > 0
        draft = drafter.propose(seq, k) if proposed else EMPTY_DRAFT
        if drafter is not None:  # the length the drafter chose (the cost-aware draft length's), else k
            stats.record_draft_length((k if draft.chosen is None else draft.chosen) if proposed else 0)
        # 2. verify: one target forward over [last committed, d_0 .. d_{K-1}] -> K + 1 rows
        logits = target.logits(torch.cat([seq, draft.tokens]), rows=len(draft) + 1)
        # 3. rule: accepted prefix + one correction-or-bonus token (NaN logits make multinomial fail: say why)
        try:
            verdict = rule(draft, logits)
        except RuntimeError:
            check_finite(logits, "target", dtype)
            raise
        if proposed:  # the drafter learns the round's outcome (the cost-aware draft length does)
            drafter.feedback(len(draft), verdict.num_accepted, verdict.first_miss)
        # 4. commit, cut after an end token; caches roll back lazily (see kv.CachedLM.logits)
        tokens = verdict.tokens.tolist()
        check_finite(logits, "target", dtype)  # after the read above: the device is idle by now
        end = next((i for i, t in enumerate(tokens) if t in stop_ids), None)
        if end is not None:
            tokens = tokens[: end + 1]
        seq = torch.cat([seq, torch.tensor(tokens, dtype=torch.long)])
        produced += len(tokens)
        # 5. stats: the rule's counters and the drafter's (the drafting level the round used)
        events = verdict.events
        if draft.events:
            events = {**(events or {}), **draft.events}
        if draft.draft_units is not None:
            events = {**(events or {}), "draft_units_drafted": draft.draft_units}
        stats.record_round(len(draft), min(verdict.num_accepted, len(tokens)), len(tokens), events)
        # 6. stream
        yield tokens
        if end is not None:
            return
