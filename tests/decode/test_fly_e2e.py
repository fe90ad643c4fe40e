"""FLy end to end: a closed gate reproduces exact; an open gate accepts more; lossy labeling."""

import json
import math

import pytest

from loosespec import DecodeConfig

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"
CLOSED = math.log(3) + 0.01  # above the largest top-3 entropy: no mismatch is ever deferred


@pytest.mark.parametrize("drafter", ["ngram", "model", "mla"])
def test_closed_gate_equals_exact_tiny(tiny_engine, drafter):
    kw = dict(max_new_tokens=60, num_draft_tokens=15, has_draft_model=True, adaptive_draft_length=False)
    exact = tiny_engine.generate(PROMPT, DecodeConfig.create("exact", drafter, **kw), raw=True)
    fly = tiny_engine.generate(
        PROMPT, DecodeConfig.create("fly", drafter, fly_entropy_threshold=CLOSED, **kw), raw=True
    )
    assert fly.token_ids == exact.token_ids
    assert fly.stats.events["fly_deferred"] == 0
    assert fly.stats.events["fly_prefix_mismatches"] == fly.stats.events["fly_hard_rejects"] > 0


def test_loose_rule_accepts_more_tiny(tiny_engine):
    kw = dict(
        max_new_tokens=80,
        num_draft_tokens=15,
        has_draft_model=True,
        draft_confidence_threshold=0.0,
        adaptive_draft_length=False,
    )
    exact = tiny_engine.generate(PROMPT, DecodeConfig.create("exact", "model", **kw), raw=True)
    fly = tiny_engine.generate(PROMPT, DecodeConfig.create("fly", "model", fly_window_size=2, **kw), raw=True)
    assert fly.stats.events["fly_deferred"] > 0
    assert fly.stats.mean_accepted_length > exact.stats.mean_accepted_length


def test_fly_config_is_labeled_lossy(tiny_engine):
    r = tiny_engine.generate(PROMPT, DecodeConfig.create("fly", "ngram", max_new_tokens=8), raw=True)
    assert r.config["lossy"] is True and r.config["method"] == "fly"
    assert r.config["num_draft_tokens"] == 15
    for key in ("fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k", "fly_sampling"):
        assert key in r.config
    exact = tiny_engine.generate(PROMPT, DecodeConfig.create("exact", "ngram", max_new_tokens=8), raw=True)
    assert exact.config["lossy"] is False


@pytest.mark.parametrize("variant", ["two-sample", "rejection"])
def test_fly_sampling_seeded(tiny_engine, variant):
    kw = dict(max_new_tokens=40, temperature=0.9, seed=3, fly_sampling=variant, has_draft_model=True)
    a = tiny_engine.generate(PROMPT, DecodeConfig.create("fly", "mla", **kw), raw=True)
    b = tiny_engine.generate(PROMPT, DecodeConfig.create("fly", "mla", **kw), raw=True)
    assert a.token_ids == b.token_ids and a.stats.rounds >= 2


@pytest.mark.real_model
@pytest.mark.parametrize("drafter", ["ngram", pytest.param("mla", marks=pytest.mark.slow)])
def test_closed_gate_equals_exact_smollm(smol_engine, drafter):
    prompt = "Write a Python function that returns the squares of a list of numbers."
    kw = dict(max_new_tokens=48, adaptive_draft_length=False)
    exact = smol_engine.generate(prompt, DecodeConfig.create("exact", drafter, num_draft_tokens=15, **kw))
    fly = smol_engine.generate(prompt, DecodeConfig.create("fly", drafter, fly_entropy_threshold=CLOSED, **kw))
    assert fly.token_ids == exact.token_ids


def test_cli_fly_json(tiny_dir):
    from test_cli import cli

    p = cli(
        "generate",
        "--json",
        "--raw",
        "--target",
        str(tiny_dir / "target"),
        "--draft",
        str(tiny_dir / "draft"),
        "--method",
        "fly",
        "--fly-window-size",
        "4",
        "--max-new-tokens",
        "12",
        "abc",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["config"]["lossy"] is True and out["config"]["fly_window_size"] == 4
    assert "fly_deferred" in out["stats"] and "fly_hard_rejects" in out["stats"]


def test_fly_model_drafts_the_full_k_without_the_confidence_stop(tiny_engine):
    """The official FLy code always drafts K and applies j <= K - W - 1 to that; a draft stopped early by the
    model drafter's confidence threshold would shrink the boundary every round. FLy turns that stop off."""
    from loosespec.config import DecodeConfig

    fly = DecodeConfig.create(
        "fly", "model", has_draft_model=True, adaptive_draft_length=False, draft_confidence_threshold=0.99
    )
    exact = DecodeConfig.create(
        "exact", "model", has_draft_model=True, adaptive_draft_length=False, draft_confidence_threshold=0.99
    )
    assert tiny_engine.build(fly)[0].confidence_threshold == 0.0
    assert tiny_engine.build(exact)[0].confidence_threshold == 0.99
    r = tiny_engine.generate(
        "Once upon a time",
        DecodeConfig.create(
            "fly",
            "model",
            has_draft_model=True,
            adaptive_draft_length=False,
            draft_confidence_threshold=0.99,
            max_new_tokens=40,
        ),
        raw=True,
    )
    # every round drafted what it asked for: K, or the budget's rest near the end (k = min(K, left - 1))
    assert all(drafted == choice for drafted, _, _, choice in r.stats.round_records), r.stats.round_records
    assert max(r.stats.draft_lengths) == fly.num_draft_tokens


def test_copy_guard_tiny(tiny_engine):
    """FLy's copy guard (a labeled LOSSY variant, off by default) end to end. On the tiny pair, a guard of one
    token (the kept draft token occurs in the prompt) refuses deferrals and counts them; a guard of three
    tokens finds no draft copying the prompt and leaves the paper's output as it was. The config records it."""
    kw = dict(
        max_new_tokens=60,
        num_draft_tokens=15,
        has_draft_model=True,
        adaptive_draft_length=False,
        fly_window_size=2,
        fly_entropy_threshold=0.0,
    )
    paper, one, three = (
        tiny_engine.generate(PROMPT, DecodeConfig.create("fly", "model", fly_copy_guard=n, **kw), raw=True)
        for n in (0, 1, 3)
    )
    assert paper.stats.events["fly_deferred"] > 0 and "fly_copy_rejects" not in paper.stats.events
    assert one.stats.events["fly_copy_rejects"] > 0 and one.token_ids != paper.token_ids
    assert three.stats.events["fly_copy_rejects"] == 0 and three.token_ids == paper.token_ids
    assert one.config["fly_copy_guard"] == 1 and one.config["lossy"] is True
