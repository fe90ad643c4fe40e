"""The real default pair (Qwen2.5-Coder 1.5B target, 0.5B draft, bfloat16). Slow on a CPU, and
it prepares about 11 GB of models: run by ``make test-full``, not by ``make test``/CI."""

import pytest

from loosespec import DecodeConfig

pytestmark = pytest.mark.default_pair

PROMPTS = [
    "Write a Python function that returns the longest common prefix of a list of strings.",
    "Explain in two sentences what a KV cache is.",
]

COPY_PROMPT = (
    "Add type hints and a docstring to this function and return the whole function:\n\n```python\n"
    "def longest_common_prefix(strings):\n    if not strings:\n        return ''\n    prefix = strings[0]\n"
    "    for s in strings[1:]:\n        while not s.startswith(prefix):\n            prefix = prefix[:-1]\n"
    "            if not prefix:\n                return ''\n    return prefix\n```"
)


@pytest.fixture(scope="module")
def qwen_engine():
    from loosespec import Engine

    return Engine.load(
        "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", dtype="bfloat16", device="cpu", progress=False
    )


@pytest.mark.parametrize("drafter", ["ngram", "mla"])
def test_fly_accepts_more_than_exact(qwen_engine, drafter):
    """FLy as published loosens exact verification: on these prompts it accepts strictly longer runs. ``>=`` would
    also pass a FLy that never defers a mismatch (then it is exact verification)."""
    # K every round (the cost-aware length may choose drafts shorter than W + 1 on this hardware, and those cannot
    # defer); prompt lookup needs something to copy: on PROMPTS alone its drafts stay too short to defer
    # (FLy and exact both 2.075 with ngram). The paper's theta 0.3: the calibrated preset's gate (0.9 nats) never
    # opened on the ngram drafts here (FLy and exact both 3.274), which tests the preset, not the rule
    exact_tau = fly_tau = 0.0
    for p in PROMPTS + ([COPY_PROMPT] if drafter == "ngram" else []):
        kw = dict(num_draft_tokens=15, max_new_tokens=64, has_draft_model=True, adaptive_draft_length=False)
        exact_tau += qwen_engine.generate(p, DecodeConfig.create("exact", drafter, **kw)).stats.mean_accepted_length
        fly = DecodeConfig.create("fly", drafter, fly_preset="paper", **kw)
        fly_tau += qwen_engine.generate(p, fly).stats.mean_accepted_length
    assert fly_tau > exact_tau


@pytest.fixture(scope="module")
def qwen_int8():
    from loosespec import Engine

    return Engine.load(
        "qwen2.5-coder-1.5b-instruct",
        "qwen2.5-coder-0.5b-instruct",
        dtype="auto",
        quantize="int8",
        device="cpu",
        progress=False,
    )


@pytest.mark.parametrize("drafter", ["ngram", "mla"])
@pytest.mark.parametrize("adaptive", [False, True])
def test_int8_exact_equals_ar(qwen_int8, drafter, adaptive):
    """Lossless stays lossless in int8: per-token activation scales and per-query attention."""
    for p in PROMPTS:
        ar = qwen_int8.generate(p, DecodeConfig.create("ar", max_new_tokens=64))
        cfg = DecodeConfig.create(
            "exact", drafter, max_new_tokens=64, has_draft_model=True, adaptive_draft_length=adaptive
        )
        assert qwen_int8.generate(p, cfg).token_ids == ar.token_ids
