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


class _StreamDecoder:
    """Text of the ids seen so far, one id at a time, in time linear in the output.

    Fast tokenizers use ``tokenizers.decoders.DecodeStream``; others decode a window of a few ids
    around the read position (the prefix/read offsets vLLM's detokenizer uses). A step returns
    ``""`` while the ids so far end inside a character (incomplete UTF-8, byte fallback).
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._backend = backend
        if backend is not None:
            from tokenizers.decoders import DecodeStream

            self._stream = DecodeStream(skip_special_tokens=True)
        else:
            self._ids: list[int] = []
            self._prefix = self._read = 0

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def step(self, token_id: int) -> str:
        if self._backend is not None:
            return self._stream.step(self._backend, int(token_id)) or ""
        self._ids.append(int(token_id))
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return new_text[len(prefix_text) :]


class TextAssembler:
    """Turns committed token chunks into text deltas, holding back what may still change.

    Held back: a trailing incomplete UTF-8 sequence and a tail that could be the start of a stop
    string. When a stop string appears, the text ends just before it and ``token_ids`` keeps the
    tokens up to the one that completed it (vLLM's convention). Detokenization is incremental
    (:class:`_StreamDecoder`): each id is decoded once, so a long stream costs linear time, not the
    quadratic cost of decoding every id again each round.
    """

    def __init__(self, tokenizer, stop: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.token_ids: list[int] = []
        self.text = ""  # text released so far
        self.stopped = False
        self._decoder = _StreamDecoder(tokenizer)
        self._full = ""  # text of all ids decoded so far (complete characters only)
        self._ends: list[int] = []  # len(self._full) after each id

    def _find_stop(self, text: str, search_from: int) -> int:
        hits = [i for s in self.stop if (i := text.find(s, search_from)) >= 0]
        return min(hits) if hits else -1

    def push(self, ids: Sequence[int]) -> str:
        """Add committed ids; return the newly releasable text (nothing once a stop string was seen)."""
        if self.stopped:
            return ""
        before = len(self.token_ids)
        for t in ids:
            self.token_ids.append(int(t))
            self._full += self._decoder.step(t)
            self._ends.append(len(self._full))
        full = self._full
        longest = max((len(s) for s in self.stop), default=0)
        search_from = max(0, len(self.text) - longest)
        at = self._find_stop(full, search_from) if self.stop else -1
        if at >= 0:
            self.stopped = True
            for n in range(before + 1, len(self.token_ids) + 1):  # fewest tokens that complete a stop
                if self._find_stop(full[search_from : self._ends[n - 1]], 0) >= 0:
                    del self.token_ids[n:]
                    break
            return self._release(at)
        end = len(full)
        for s in self.stop:  # hold back a suffix that might grow into a stop string
            for k in range(min(len(s) - 1, end), 0, -1):
                if full.endswith(s[:k], 0, end):
                    end -= k
                    break
        return self._release(end)

    def finish(self) -> str:
        """Release everything still held back (generation ended without a stop string).

        One full decode, so that an output ending inside a character still shows it (as U+FFFD).
        """
        if self.stopped:
            return ""
        full = self.tokenizer.decode(self.token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        if len(full) <= len(self.text) or not full.startswith(self.text):
            return ""
        delta = full[len(self.text) :]
        self.text = full
        return delta

    def _release(self, end: int) -> str:
        """Release the decoded text up to ``end`` (the released text is always a prefix of it)."""
        if end <= len(self.text):
            return ""
        delta = self._full[len(self.text) : end]
        self.text += delta
        return delta
