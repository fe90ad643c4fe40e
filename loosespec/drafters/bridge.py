"""Drafting across tokenizers: a draft model whose vocabulary differs from the target's.

The draft proposes in its own tokens; the proposal travels to the target as text. Each round:

1. **target -> draft.** The committed target ids are decoded to text (special tokens kept as
   text, so a ChatML prompt stays ChatML) and re-encoded with the draft tokenizer. The draft
   model's :class:`~loosespec.decode.kv.CachedLM` treats its cache as a memo of the ids it was computed
   on, so it keeps the longest common prefix with the previous round's draft ids and recomputes
   only the rest: rejected draft tokens, and any tail whose draft tokenization changed because the
   target committed text that merges differently, are rolled back right there.
2. **draft.** The wrapped drafter (``model`` or ``mla``, working entirely in draft ids) proposes
   up to K draft tokens; a draft end token ends the proposal and is dropped (the target writes
   its own end token when it agrees).
3. **draft -> target.** The proposal is decoded to text (bytes of a character cut in half at the
   end are held back) and encoded with the target tokenizer together with a look-behind window
   of the last committed target tokens, so merges across the boundary come out as the target
   tokenizer makes them; the window's own ids must come back unchanged, else (a merge into the
   committed text, which the target cannot undo) the proposal is encoded on its own.

Verification then runs on target ids as usual, so greedy ``exact`` keeps the target's own greedy
output exactly (tested in float32) and ``fly`` applies its rule to the re-encoded draft.

Sampling (T > 0) with ``rejection`` or FLy's ``rejection`` variant: speculative sampling proper
needs the draft's distribution ``q`` over the *target's* vocabulary, which a text bridge does not
give (a greedy text-bridged proposal would be verified as a deterministic one, like prompt lookup:
lossless, but each token kept only with probability ``p(d)``). There the draft samples through the
**token-level intersection** (TLI, Timor et al. 2025, as in transformers'
``AssistantVocabTranslatorCache``): :class:`VocabIntersection` pairs the tokens whose bytes are the
same in both vocabularies (byte-level BPE and sentencepiece-style ``\u2581``/``<0xNN>`` pieces both
reduced to bytes; special tokens left out); the draft's logits outside it are masked before
temperature/top-k/top-p, each drafted token maps one-to-one to a target token, and ``q`` is carried
over to the target's ids (zero elsewhere). Rejection sampling then keeps a token with probability
``min(1, p/q)`` and emits every token from the target's own distribution: lossless (the drafted
target ids may spell a text in pieces the target tokenizer would merge; the target scores whatever
ids it is given, as in transformers' TLI). Greedy decoding keeps the text bridge, whose
unrestricted draft agrees with the target more often. FLy's default ``two-sample`` variant drafts
greedily, through the text bridge, at any temperature.

Differences from transformers' universal assisted generation (UAG): UAG re-tokenizes a window of the *draft's* recent ids and aligns new tokens by searching for the
longest overlap, and it uses the target prompt re-encoded the same way; here the whole committed
text is re-encoded each round (exact, O(length) in a fast Rust tokenizer, negligible next to a
forward) and the cache memo finds the rollback point.

Statistics: ``drafted_tokens`` and ``accepted_tokens`` count target tokens (what the target
verified and kept), and ``draft_units_drafted`` counts the draft model's own tokens, so the two
vocabularies' granularity can be compared.
"""

from __future__ import annotations

import json
from collections.abc import Collection

import torch

from loosespec.drafters.base import Draft, Drafter

LOOKBEHIND = 8  # committed target tokens re-encoded with each proposal


class TokenizerBridge:
    """Maps a target-token sequence to draft tokens and a draft proposal back to target tokens."""

    def __init__(self, target_tokenizer, draft_tokenizer, lookbehind: int = LOOKBEHIND):
        self.target = target_tokenizer
        self.draft = draft_tokenizer
        self.lookbehind = lookbehind

    def to_draft(self, target_ids: torch.Tensor) -> torch.Tensor:
        text = self.target.decode(target_ids.tolist(), skip_special_tokens=False)
        return torch.tensor(self.draft.encode(text, add_special_tokens=False), dtype=torch.long)

    def to_target(self, target_ids: torch.Tensor, draft_ids: torch.Tensor, proposal: list[int]) -> list[int]:
        """Target ids for the text the draft's ``proposal`` adds after ``draft_ids``."""
        if not proposal:
            return []
        ctx = draft_ids[-self.lookbehind :].tolist()
        before = self.draft.decode(ctx, skip_special_tokens=False)
        after = self.draft.decode(ctx + proposal, skip_special_tokens=False)
        if not after.startswith(before):  # a character completed across the boundary
            k = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
            before = before[:k]
        new_text = after[len(before) :].rstrip("\ufffd")  # hold back a character cut in half
        if not new_text:
            return []
        window = target_ids[-self.lookbehind :].tolist()
        wtext = self.target.decode(window, skip_special_tokens=False)
        ids = self.target.encode(wtext + new_text, add_special_tokens=False)
        if ids[: len(window)] == window and len(ids) > len(window):
            return ids[len(window) :]
        return self.target.encode(new_text, add_special_tokens=False)


class DraftSide:
    """How SpecGuard's step loop reaches the draft model: its ids, end tokens and detokenizer, and
    the way back to target ids. Identity for a draft that shares the target's tokenizer."""

    def __init__(
        self,
        detokenize,
        stop_ids: Collection[int],
        bridge: TokenizerBridge | None = None,
        target_eos: int | None = None,
    ):
        self.detokenize = detokenize  # draft ids -> text
        self.stop_ids = frozenset(stop_ids)  # the draft's end tokens
        self.bridge = bridge
        self.target_eos = target_eos

    def to_draft(self, seq: torch.Tensor) -> torch.Tensor:
        return seq if self.bridge is None else self.bridge.to_draft(seq)

    def to_target(self, seq: torch.Tensor, draft_seq: torch.Tensor, tokens: list[int]) -> list[int]:
        """A drafted step in target ids; a draft end token becomes the target's end token."""
        if self.bridge is None:
            return tokens
        ended = bool(tokens) and tokens[-1] in self.stop_ids
        out = self.bridge.to_target(seq, draft_seq, tokens[:-1] if ended else tokens)
        return out + [self.target_eos] if ended and self.target_eos is not None else out


class BridgedDrafter(Drafter):
    """A draft-model drafter (``model`` / ``mla``) working in the draft's vocabulary, proposing
    target tokens through a :class:`TokenizerBridge` (greedy drafting)."""

    def __init__(self, inner, bridge: TokenizerBridge, draft_stop_ids: Collection[int]):
        self.inner = inner
        self.name = inner.name
        self.bridge = bridge
        self.draft_stop_ids = frozenset(draft_stop_ids)

    def propose(self, seq: torch.Tensor, k: int) -> Draft:
        draft_ids = self.bridge.to_draft(seq)
        proposal = self.inner.propose(draft_ids, k).tokens.tolist()
        units = len(proposal)
        end = next((i for i, t in enumerate(proposal) if t in self.draft_stop_ids), None)
        if end is not None:
            proposal = proposal[:end]
        tokens = self.bridge.to_target(seq, draft_ids, proposal)[:k]
        return Draft(torch.tensor(tokens, dtype=torch.long), None, draft_units=units)


def token_bytes(tokenizer) -> dict[int, bytes]:
    """Each ordinary token's bytes: byte-level BPE (GPT-2 style) and sentencepiece-style vocabularies
    (``\u2581`` for a space, ``<0xNN>`` byte fallback) both reduced to the bytes they decode to."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    decoder = json.dumps(json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder"))
    byte_level = '"ByteLevel"' in decoder
    unbyte = {c: b for b, c in bytes_to_unicode().items()}
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    out: dict[int, bytes] = {}
    for piece, i in tokenizer.get_vocab().items():
        if i in special:
            continue
        if byte_level:
            if all(c in unbyte for c in piece):
                out[i] = bytes(unbyte[c] for c in piece)
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            out[i] = bytes([int(piece[3:5], 16)])
        else:
            out[i] = piece.replace("\u2581", " ").encode("utf-8")
    return out


class VocabIntersection:
    """The tokens two vocabularies share (same bytes): draft id -> target id.

    ``draft_mask`` ([draft logits width] bool) marks the draft ids that have a target twin;
    ``to_target`` maps them ([draft width] int64, -1 where there is none).
    """

    def __init__(self, to_target: torch.Tensor, target_width: int):
        self.to_target = to_target.long()  # [draft width]
        self.draft_mask = self.to_target >= 0
        self.target_width = target_width
        self._shared = self.draft_mask.nonzero().squeeze(-1)  # draft ids with a twin, and the twins
        self._twins = self.to_target[self._shared]

    @classmethod
    def between(cls, target_tokenizer, draft_tokenizer, target_width: int, draft_width: int) -> "VocabIntersection":
        """``*_width``: the models' logits widths (a model may have more rows than its tokenizer has tokens)."""
        by_bytes: dict[bytes, int] = {}
        for i, b in sorted(token_bytes(target_tokenizer).items()):
            by_bytes.setdefault(b, i)
        to_target = torch.full((draft_width,), -1, dtype=torch.long)
        for i, b in token_bytes(draft_tokenizer).items():
            t = by_bytes.get(b)
            if t is not None and i < draft_width and t < target_width:
                to_target[i] = t
        return cls(to_target, target_width)

    def __len__(self) -> int:
        return int(self.draft_mask.sum())

    def map_draft(self, draft: Draft) -> Draft:
        """A proposal drawn inside the intersection, in target ids, ``q`` carried over (zero elsewhere)."""
        tokens = self.to_target[draft.tokens]
        keep = int((tokens >= 0).long().cumprod(0).sum())  # only a masked draft's end token can miss
        tokens = tokens[:keep]
        probs = None
        if draft.probs is not None:
            q = draft.probs[:keep]
            probs = torch.zeros(keep, self.target_width, dtype=q.dtype, device=q.device)
            probs[:, self._twins.to(q.device)] = q[:, self._shared.to(q.device)]
        return Draft(tokens, probs, draft_units=len(draft))


class IntersectionDrafter(Drafter):
    """A draft-model drafter (``model`` / ``mla``) sampling only tokens the target's vocabulary shares
    (its :class:`~loosespec.verify.sampling.SamplingParams` carry ``vocab_mask``), so its proposal and
    ``q`` are in target ids: lossless rejection sampling across tokenizers (TLI)."""

    def __init__(self, inner, bridge: TokenizerBridge, intersection: VocabIntersection):
        self.inner = inner
        self.name = inner.name
        self.bridge = bridge
        self.intersection = intersection

    def propose(self, seq: torch.Tensor, k: int) -> Draft:
        return self.intersection.map_draft(self.inner.propose(self.bridge.to_draft(seq), k))
