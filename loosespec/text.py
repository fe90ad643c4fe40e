"""Prompt formatting and incremental detokenization with stop strings.

Token counts always come from ids; text is derived from ids, never the other way round.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# End-of-turn markers of common chat templates; generation ends at any of them that the
# tokenizer knows as a single token, besides the tokenizer's and the model's own EOS ids.
_END_MARKERS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|endoftext|>", "<|end|>", "</s>")


def end_token_ids(model, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (gen_eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    vocab = tokenizer.get_vocab()
    ids.update(vocab[m] for m in _END_MARKERS if m in vocab)
    return frozenset(ids)


def encode_prompt(tokenizer, prompt: str | Sequence[dict], raw: bool = False) -> torch.Tensor:
    """Prompt ids ([L] int64). Instruct models get their chat template unless ``raw``.

    ``prompt`` is a string (one user turn) or a list of ``{"role", "content"}`` messages.
    """
    if isinstance(prompt, str) and (raw or not getattr(tokenizer, "chat_template", None)):
        ids = tokenizer(prompt).input_ids
    else:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False).input_ids
    return torch.tensor(ids, dtype=torch.long)


class TextAssembler:
    """Turns committed token chunks into text deltas, holding back what may still change.

    Held back: a trailing incomplete UTF-8 sequence (decoded as U+FFFD) and a tail that could be
    the start of a stop string. When a stop string appears, the text ends just before it and
    ``token_ids`` keeps the tokens up to the one that completed it (vLLM's convention).
    """

    def __init__(self, tokenizer, stop: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.token_ids: list[int] = []
        self.text = ""  # text released so far
        self.stopped = False

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _find_stop(self, text: str, search_from: int) -> int:
        hits = [i for s in self.stop if (i := text.find(s, search_from)) >= 0]
        return min(hits) if hits else -1

    def push(self, ids: Sequence[int]) -> str:
        """Add committed ids; return the newly releasable text."""
        before = len(self.token_ids)
        self.token_ids.extend(ids)
        full = self._decode(self.token_ids)
        longest = max((len(s) for s in self.stop), default=0)
        at = self._find_stop(full, max(0, len(self.text) - longest)) if self.stop else -1
        if at >= 0:
            self.stopped = True
            for n in range(before + 1, len(self.token_ids) + 1):  # fewest tokens that complete a stop
                if self._find_stop(self._decode(self.token_ids[:n]), 0) >= 0:
                    del self.token_ids[n:]
                    break
            return self._release(full[:at])
        safe = full.rstrip("\ufffd")
        for s in self.stop:  # hold back a suffix that might grow into a stop string
            for k in range(min(len(s) - 1, len(safe)), 0, -1):
                if safe.endswith(s[:k]):
                    safe = safe[: len(safe) - k]
                    break
        return self._release(safe)

    def finish(self) -> str:
        """Release everything still held back (generation ended without a stop string)."""
        if self.stopped:
            return ""
        return self._release(self._decode(self.token_ids))

    def _release(self, upto: str) -> str:
        if len(upto) <= len(self.text) or not upto.startswith(self.text):
            return ""
        delta = upto[len(self.text):]
        self.text = upto
        return delta
