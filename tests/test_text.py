"""Incremental detokenization and stop strings, on the offline byte-level tokenizer."""

from conftest import make_tiny_tokenizer

from loosespec.text import TextAssembler


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
