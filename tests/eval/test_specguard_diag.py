"""SpecGuard's grounding diagnosis and held-out calibration (:mod:`loosespec.eval.specguard_diag`)."""

from __future__ import annotations

import random

import pytest
import torch

from loosespec.eval import specguard_diag as D
from loosespec.verify.grounding import grounding_from_step_rows


def causal_maps(layers: int, n: int, sink_weight: float = 0.0) -> torch.Tensor:
    """[layers, n, n] row-stochastic causal maps: uniform, plus ``sink_weight`` of every row on position 0."""
    m = torch.tril(torch.ones(n, n))
    m = m / m.sum(dim=-1, keepdim=True)
    m[1:, 0] += sink_weight
    m = m / m.sum(dim=-1, keepdim=True)
    return m.expand(layers, n, n).clone()


def test_rollout3_min_is_specguards_g():
    maps = causal_maps(4, 12)
    ctx = 8
    rows = [maps[i, None, ctx:] for i in range(1, 4)]  # the last 3 layers' step rows, one head
    assert D.grounding_variants(maps, ctx)["rollout3_min"] == pytest.approx(
        grounding_from_step_rows(rows, ctx), abs=1e-5
    )


def test_the_sink_counts_as_grounding_unless_left_out():
    ctx = 10
    plain, sunk = D.grounding_variants(causal_maps(3, 14), ctx), D.grounding_variants(causal_maps(3, 14, 20.0), ctx)
    # nearly all of a step token's attention on position 0 (context): grounded by the plain measure ...
    assert sunk["last_mean"] > 0.9 and sunk["last_mean"] > plain["last_mean"]
    # ... but not once the sink is left out: the rest of its attention is spread as in the uniform map
    assert sunk["last_nosink_mean"] == pytest.approx(plain["last_nosink_mean"], abs=1e-6)
    assert len(sunk["layer_mean"]) == 3 and set(D.SCALAR_VARIANTS) <= set(sunk)
    with pytest.raises(ValueError):
        D.grounding_variants(causal_maps(3, 14), 3)  # a context no longer than the sink


def synthetic_steps(n_problems: int = 30, per: int = 8, seed: int = 0) -> list[dict]:
    """Steps where last_mean separates what the target prefers, confidence is noise, rollout3_min tracks length."""
    rng = random.Random(seed)
    out = []
    for p in range(n_problems):
        for _ in range(per):
            prefers = rng.random() < 0.4
            tokens = rng.randint(4, 60)
            g = {v: rng.random() for v in D.SCALAR_VARIANTS}
            g["last_mean"] = (0.6 if prefers else 0.3) + 0.25 * rng.random()
            g["rollout3_min"] = 1 - tokens / 64
            g["layer_mean"] = [g["last_mean"], rng.random()]
            out.append(
                {
                    "problem": f"p{p}",
                    "tokens": tokens,
                    "target_prefers": prefers,
                    "agrees": prefers and rng.random() < 0.5,
                    "confidence_min": rng.random(),
                    "confidence_mean": rng.random(),
                    "g_variants": g,
                }
            )
    return out


def test_diagnose_finds_the_variant_that_carries_information_and_the_length_bias():
    d = D.diagnose(synthetic_steps())
    assert "last_mean" in d["informative"]
    # the noise variants stay near chance (one may clear 0.5 by luck: nine variants are tested)
    assert all(d["signals"][v]["auc_target_prefers"] < 0.65 for v in D.SCALAR_VARIANTS if v != "last_mean")
    assert d["signals"]["last_mean"]["auc_target_prefers"] > 0.9
    assert d["signals"]["rollout3_min"]["rho_length"] == pytest.approx(-1.0)
    assert d["layers"][0]["auc_target_prefers"] == d["signals"]["last_mean"]["auc_target_prefers"]
    text = D.format_diagnosis(d)
    assert "| last_mean | " in text and "| 1 | " in text and "interval lies above 0.5: " in text


def test_heldout_chooses_on_the_fit_problems_and_scores_the_others():
    steps = synthetic_steps()
    fit, held = D.split_problems(steps)
    assert {s["problem"] for s in fit} == {f"p{i}" for i in range(18)} and len(fit) + len(held) == len(steps)
    h = D.heldout(steps)
    assert (h["fit_problems"], h["held_out_problems"]) == (18, 12)
    weighted = h["rules"][D.WEIGHTED_ANY]
    assert weighted["choice"]["grounding"] == "last_mean" and weighted["choice"]["sg_beta"] < 0.5
    assert weighted["held_out"]["precision"] > 0.9 and weighted["held_out"]["auc"] > 0.9
    both = h["rules"][D.BOTH_ANY]
    assert both["choice"]["grounding"] == "last_mean" and both["held_out"]["precision"] > 0.9
    # the rules a default can ship use SpecGuard's own G, which tracks length here and carries nothing
    shipped_w, shipped_b = h["rules"][D.WEIGHTED_SHIPPED], h["rules"][D.BOTH_SHIPPED]
    assert shipped_w["choice"]["grounding"] == shipped_b["choice"]["grounding"] == D.SPECGUARD_G
    assert shipped_w["held_out"]["auc"] < weighted["held_out"]["auc"] - 0.2
    alone = h["rules"]["confidence alone (beta 1)"]
    assert alone["held_out"]["auc"] < 0.7  # confidence is noise here
    text = D.format_heldout(h)
    assert f"| {D.BOTH_ANY} | C_" in text and "last_mean >= " in text and f"| {D.BOTH_SHIPPED} | C_" in text


def test_steps_without_variants_are_left_out_and_none_is_an_error():
    old = [{k: v for k, v in s.items() if k != "g_variants"} for s in synthetic_steps(4, 2)]
    with pytest.raises(ValueError):
        D.diagnose(old)
    assert D.diagnose(old + synthetic_steps(10, 4))["steps"] == 40


def test_heldout_needs_both_labels_on_the_fit_part():
    steps = synthetic_steps(10, 4)
    for s in steps:
        s["target_prefers"] = True
    with pytest.raises(ValueError, match="one label"):
        D.heldout(steps)


def test_heldout_scores_the_defaults_as_they_are():
    default = {"sg_confidence": "mean", "sg_beta": 0.8, "sg_tau": 0.5}
    h = D.heldout(synthetic_steps(), default=default)
    assert list(h["rules"])[-1] == D.DEFAULTS_ROW  # last, under the rules it is compared with
    row = h["rules"][D.DEFAULTS_ROW]
    assert row["choice"]["sg_tau"] == 0.5 and row["choice"]["grounding"] == "rollout3_min"
    steps = D._labelled(synthetic_steps())
    _, held = D.split_problems(steps)
    accepted = [0.8 * s["confidence_mean"] + 0.2 * s["g_variants"]["rollout3_min"] >= 0.5 for s in held]
    assert row["held_out"]["accept_rate"] == pytest.approx(sum(accepted) / len(held), abs=1e-4)


def test_step_use_table_counts_what_each_specguard_method_ran():
    from loosespec.eval.specguard_diag import step_use_table

    rows = [
        {"method": "ar", "stats": {"new_tokens": 9}},
        {
            "method": "specguard",
            "stats": {"steps": 3, "skipped_steps": 5, "accepted_steps": 2, "attempts_by_k": {"1": 2, "4": 1}},
        },
        {
            "method": "specguard",
            "stats": {"steps": 1, "skipped_steps": 7, "accepted_steps": 0, "attempts_by_k": {"1": 1}},
        },
        {"method": "specguard@x", "stats": {"steps": 0, "skipped_steps": 4, "accepted_steps": 0, "attempts_by_k": {}}},
    ]
    lines = step_use_table(rows).splitlines()
    assert lines[2] == "| specguard | 2 | 16 | 12 | 4 | 1: 3, 4: 1 | 2 (0.50) |"
    assert lines[3] == "| specguard@x | 1 | 4 | 4 | 0 | - | 0 |"
    assert len(lines) == 4  # ar wrote no steps: no line
