"""verify/ imports nothing above it, so the knob defaults it needs are written out there, on lines marked
"(knob default, tests/verify/test_defaults.py)" (tests/test_config.py lets only those repeat a knob's default);
this test, not an import, keeps each equal to its knob's declared default in loosespec.config."""

import dataclasses
import inspect
import re
from pathlib import Path

from loosespec.config import knob_default
from loosespec.verify import fly
from loosespec.verify.sampling import SamplingParams

VERIFY = Path(__file__).resolve().parents[2] / "loosespec" / "verify"
MARK = "(knob default, tests/verify/test_defaults.py)"


def test_sampling_params_defaults_are_the_knobs():
    fields = {f.name: f.default for f in dataclasses.fields(SamplingParams) if f.name != "vocab_mask"}
    assert fields == {name: knob_default(name) for name in ("temperature", "top_p", "top_k")}
    assert SamplingParams().greedy  # the knobs' default temperature 0 decodes greedily


def test_every_marked_default_is_checked():
    """A line marked as a knob default in verify/ is one of those checked above."""
    marked = {
        (p.name, re.match(r"\s*(\w+)", line).group(1))
        for p in VERIFY.rglob("*.py")
        for line in p.read_text(encoding="utf-8").splitlines()
        if MARK in line
    }
    assert marked == {("sampling.py", "temperature"), ("sampling.py", "top_p"), ("sampling.py", "top_k")}


def test_fly_entropy_top_k_default_is_the_knob():
    """FLy's k of the entropy gate. (The rule functions' theta, W and boundary defaults are vLLM's native FLy's,
    for callers that pass none; their knobs default to None, filled by a preset: nothing to compare.)"""
    assert fly.TOP_K == inspect.signature(fly.topk_entropy).parameters["k"].default == knob_default("fly_entropy_top_k")
