"""Incremental detokenization and stop strings, on the offline byte-level tokenizer."""

import pytest
from conftest import make_tiny_tokenizer

from loosespec.decode.text import TextAssembler


def ids(tok, s):
    return tok(s, add_special_tokens=False).input_ids


def test_deltas_concatenate_to_the_text():
    tok = make_tiny_tokenizer()
    a = TextAssembler(tok)
    out = "".join(a.push([t]) for t in ids(tok, "héllo wörld ✓")) + a.finish()
    assert out == "héllo wörld ✓"


def test_incomplete_utf8_is_held_back():
    tok = make_tiny_tokenizer()
    a = TextAssembler(tok)
    b = ids(tok, "✓")  # three byte tokens
    assert len(b) == 3
    assert a.push(b[:1]) == "" and a.push(b[1:2]) == ""
    assert a.push(b[2:]) == "✓"


def test_stop_string_cuts_text_and_tokens():
    tok = make_tiny_tokenizer()
    a = TextAssembler(tok, stop=["END"])
    toks = ids(tok, "abc ENDxyz")
    released = a.push(toks)
    assert a.stopped and released == "abc " and a.text == "abc "
    assert tok.decode(a.token_ids) == "abc END"  # tokens up to the one completing the stop


def test_partial_stop_is_held_then_released():
    tok = make_tiny_tokenizer()
    a = TextAssembler(tok, stop=["STOP"])
    assert a.push(ids(tok, "go ST")) == "go "  # "ST" may start "STOP"
    assert a.push(ids(tok, "AR")) == "STAR"
    assert not a.stopped


def test_stop_split_across_chunks():
    tok = make_tiny_tokenizer()
    a = TextAssembler(tok, stop=["\n\n"])
    assert a.push(ids(tok, "one\n")) == "one"
    assert a.push(ids(tok, "\ntwo")) == ""
    assert a.stopped and a.text == "one"


class CountingTokenizer:
    """Wraps a tokenizer, counting the ids it is asked to decode; ``fast=False`` hides the Rust backend so
    the windowed fallback decoder is used."""

    def __init__(self, tok, fast: bool):
        self.tok, self.decoded_ids, self.decode_calls = tok, 0, 0
        if fast:
            self.backend_tokenizer = tok.backend_tokenizer

    def decode(self, ids, **kw):
        self.decode_calls += 1
        self.decoded_ids += len(ids)
        return self.tok.decode(ids, **kw)


def long_stream(tok, n: int = 2000) -> list[int]:
    text = "".join(f"line {i}: café ✓ 数据 {'é' * (i % 3)}\n" for i in range(400))
    out = ids(tok, text)[:n]
    assert len(out) == n
    return out


def chunks(seq, seed=0):
    import random

    rng, i = random.Random(seed), 0
    while i < len(seq):
        k = rng.randint(1, 16)
        yield seq[i : i + k]
        i += k


@pytest.mark.parametrize("fast", [True, False])
def test_stream_of_2000_tokens_decodes_in_linear_time(fast):
    """Each id is decoded a bounded number of times (counted, not timed); the text equals one full decode."""
    tok = make_tiny_tokenizer()
    stream = long_stream(tok)
    counting = CountingTokenizer(tok, fast)
    a = TextAssembler(counting, stop=["NEVER"])
    out = "".join(a.push(c) for c in chunks(stream)) + a.finish()
    assert out == tok.decode(stream, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    full_decode_at_finish = len(stream)
    if fast:
        assert counting.decode_calls == 1 and counting.decoded_ids == full_decode_at_finish
    else:  # two windows of a few ids per id; decoding everything each round would be ~n^2/2 / 8 = 250,000
        assert counting.decoded_ids - full_decode_at_finish <= 16 * len(stream)


@pytest.mark.parametrize("fast", [True, False])
def test_fallback_and_stream_agree_on_stops_and_held_bytes(fast):
    tok = make_tiny_tokenizer()
    a = TextAssembler(CountingTokenizer(tok, fast), stop=["✓ 数"])
    stream = long_stream(tok)
    out = "".join(a.push(c) for c in chunks(stream, seed=1))  # pushes after the stop release nothing
    assert a.stopped and out == "line 0: café "
    assert tok.decode(a.token_ids).endswith("✓ 数")  # tokens up to the one completing the stop
    assert not tok.decode(a.token_ids[:-1]).endswith("✓ 数")
