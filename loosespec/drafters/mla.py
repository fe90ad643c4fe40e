"""FLy's multi-level acceleration (MLA): a draft model that is itself sped up by n-gram lookup.

Each draft forward scores ``[last, c_0 .. c_{M-1}]`` where ``c`` is an n-gram lookup proposal;
the draft model verifies ``c`` with the same lossless rules the target uses on the draft (greedy
exact match, or rejection sampling with the n-gram's one-hot ``q``), so one draft forward yields
1..M+1 tokens and the proposal is distributed exactly as the draft model's own decoding:
identical to its greedy output when greedy. FLy defaults: max_ngram 4, M = 6 per lookup.

Example: the draft model would write ``a b c d``; the lookup proposes ``b c x``. One forward on
``[a, b, c, x]`` keeps ``b c`` and emits the draft's own ``d``: three tokens for one forward.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from loosespec.decode.kv import CachedLM
from loosespec.drafters.base import Draft, Drafter
from loosespec.drafters.ngram import ngram_lookup
from loosespec.verify.exact import greedy_verify
from loosespec.verify.rejection import rejection_verify
from loosespec.verify.sampling import SamplingParams, check_finite, logits_to_probs


class MlaDrafter(Drafter):
    name = "mla"

    def __init__(
        self,
        lm: CachedLM,
        sampling: SamplingParams,
        generator: torch.Generator | None,
        stop_ids: Collection[int] = (),
        max_ngram: int = 4,
        lookup_tokens: int = 6,
        min_ngram: int = 1,
    ):
        self.lm = lm
        self.sampling = sampling
        self.generator = generator
        self.stop_ids = frozenset(stop_ids)
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.lookup_tokens = lookup_tokens

    def propose(self, seq: torch.Tensor, k: int) -> Draft:
        out = seq[:0]
        probs: list[torch.Tensor] = []
        while out.shape[0] < k and not (out.shape[0] and int(out[-1]) in self.stop_ids):
            cur = torch.cat([seq, out])
            # leave room for the token the draft model adds after the candidates
            room = min(self.lookup_tokens, k - out.shape[0] - 1)
            cand = ngram_lookup(cur, self.max_ngram, room, self.min_ngram, self.stop_ids)
            logits = self.lm.logits(torch.cat([cur, cand]), rows=cand.shape[0] + 1)  # [C + 1, V]
            if self.sampling.greedy:
                verdict = greedy_verify(cand, logits)
            else:
                p = logits_to_probs(logits, self.sampling)
                try:
                    verdict = rejection_verify(cand, None, p, self.generator)
                except RuntimeError:  # multinomial refuses NaN/inf probabilities: say why
                    check_finite(logits, "draft", self.lm.model.dtype)
                    raise
                # each emitted token is marginally distributed as the draft model's p at its row
                probs.extend(p[: verdict.num_accepted + 1])
            new = verdict.tokens.cpu()
            stop = torch.isin(new, torch.tensor(sorted(self.stop_ids), dtype=torch.long)).nonzero()
            if stop.numel():
                new = new[: int(stop[0, 0]) + 1]
                probs = probs[: out.shape[0] + new.shape[0]] if probs else probs
            out = torch.cat([out, new])
        return Draft(out, torch.stack(probs) if probs else None)
