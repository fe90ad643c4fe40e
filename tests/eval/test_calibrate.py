"""SpecGuard's calibration: the target-preference label, the signal analysis and choice, resuming."""

from __future__ import annotations

import json

import pytest
import torch

from loosespec.config import DecodeConfig
from loosespec.eval.calibrate import (
    analyse,
    analyse_report,
    auc_ci95,
    calibrate_specguard,
    format_analysis,
    rank_correlation,
    roc_auc,
    target_preference,
)
from loosespec.eval.datafiles import Problem
from loosespec.eval.datasets import load_dataset


def test_rank_correlation():
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert rank_correlation([1, 2, 2, 3], [1, 2, 2, 3]) == 1.0  # ties share their rank
    assert rank_correlation([1, 1, 1], [1, 2, 3]) is None and rank_correlation([1, 2], [1, 2]) is None


class FakeLM:
    """Logits that give token t the log-prob -t (up to normalisation) at every position; records feeds."""

    def __init__(self, vocab=6):
        self.vocab, self.calls = vocab, []

    def logits(self, seq, rows):
        self.calls.append((seq.tolist(), rows))
        return -torch.arange(self.vocab, dtype=torch.float32).repeat(rows, 1)


def test_target_preference_compares_the_candidate_with_the_targets_own_step():
    lm = FakeLM()
    lse = float(torch.logsumexp(-torch.arange(6.0), 0))
    steps = [{"candidate": [1, 1], "written": 2}, {"candidate": [5], "written": 1}]
    target_preference(lm, torch.tensor([0, 0]), [1, 0, 0], steps, margin=0.5)
    a, b = steps
    assert a["lp_candidate"] == pytest.approx(-1 - lse) and a["lp_own"] == pytest.approx(-0.5 - lse)
    assert a["preference_gap"] == pytest.approx(-0.5) and a["target_prefers"] is True  # within the margin
    assert b["preference_gap"] == pytest.approx(-5.0) and b["target_prefers"] is False
    # candidate after the step's context, then the target's own step: the next step's context
    assert [c for c, _ in lm.calls] == [[0, 0, 1, 1], [0, 0, 1, 0], [0, 0, 1, 0, 5], [0, 0, 1, 0, 0]]


def step(g, cmin, cmean, agrees, gap, tokens=10):
    return {
        "grounding": g,
        "confidence_min": cmin,
        "confidence_mean": cmean,
        "agrees": agrees,
        "preference_gap": gap,
        "target_prefers": gap >= -0.1,
        "tokens": tokens,
    }


def test_analyse_picks_the_signal_that_separates_what_the_target_prefers():
    # C_mean orders the steps exactly as the target's preference, G the other way round
    steps = [
        step(0.4, 0.2, 0.9, True, 0.0, 5),
        step(0.5, 0.9, 0.8, False, -0.05, 20),
        step(0.6, 0.1, 0.3, False, -1.0, 8),
        step(0.8, 0.8, 0.2, False, -2.0, 30),
    ]
    a = analyse(steps, beta=0.3)
    assert a["signals"]["C_mean"]["auc_target_prefers"] == 1.0
    assert a["signals"]["G"]["auc_target_prefers"] == 0.0 and a["signals"]["G"]["rho_preference_gap"] == -1.0
    assert a["signals"]["C_min"]["rho_length"] > 0.5  # longer steps here have higher C_min
    # S separates perfectly from beta 0.4 up (at 0.3 the last step outscores the first); of those, the one nearest the current beta
    assert (a["choice"]["sg_confidence"], a["choice"]["sg_beta"]) == ("mean", 0.4)
    # tau accepts the share the target prefers (2 of 4): S = 0.4 C + 0.6 G = 0.6, 0.62, 0.48, 0.56
    assert a["choice"]["sg_tau"] == pytest.approx(0.6) and a["choice"]["at_tau"]["precision"] == 1.0
    assert a["target_prefers_rate"] == 0.5 and a["agree_rate"] == 0.25
    with pytest.raises(ValueError):
        analyse([{**steps[0], "target_prefers": None}], beta=0.3)


def test_auc_interval_resamples_whole_problems():
    import random

    rng = random.Random(0)
    labels = [rng.random() < 0.4 for _ in range(120)]
    scores = [rng.gauss(1.0 if y else 0.0, 1.0) for y in labels]
    groups = [f"p{i // 4}" for i in range(120)]  # 30 problems of 4 steps
    lo, hi = auc_ci95(scores, labels, groups)
    assert lo < roc_auc(scores, labels) < hi and 0.05 < hi - lo < 0.4
    assert auc_ci95(scores, labels, groups) == (lo, hi)  # seeded
    # one problem holding everything: every resample is that problem, so no spread at all
    assert auc_ci95(scores, labels, ["p"] * 120) == (round(roc_auc(scores, labels), 4),) * 2
    separated = auc_ci95([1.0, 0.0] * 20, [True, False] * 20, [f"p{i // 2}" for i in range(40)])
    assert separated == (1.0, 1.0)


def test_calibration_set_is_disjoint_from_the_benchmarks():
    train = load_dataset("gsm8k-train", limit=300)
    test = {p.prompt for p in load_dataset("gsm8k")}
    assert len(train) == 300 and all(p.id.startswith("gsm8k-train/") for p in train)
    assert not test & {p.prompt for p in train}


def test_calibrate_on_the_tiny_pair_labels_every_step_and_resumes(tiny_engine, tmp_path, monkeypatch):
    problems = [Problem(f"t/{i}", "t", f"Question {i}: what is {i} + {i}?", str(2 * i), {}) for i in range(2)]
    cfg = DecodeConfig.create(
        "specguard", None, has_draft_model=True, max_new_tokens=24, sg_candidates=2, sg_max_step_tokens=8
    )
    steps_file = tmp_path / "cal.steps.jsonl"
    report = calibrate_specguard(tiny_engine, problems, cfg, progress=False, steps_file=steps_file)
    steps = report["steps"]
    assert steps and all(s["agrees"] is not None and s["target_prefers"] is not None for s in steps)
    # the target wrote every step: what it wrote adds up to the output
    per_problem = [json.loads(x) for x in steps_file.read_text().splitlines()]
    assert [p["problem"] for p in per_problem] == ["t/0", "t/1"]
    assert all(sum(s["written"] for s in p["steps"]) == p["new_tokens"] for p in per_problem)
    # a step the target wrote exactly as the candidate has the same log-prob both ways
    for s in steps:
        if s["agrees"]:
            assert s["preference_gap"] == pytest.approx(0.0, abs=1e-5)
    assert "| G |" in format_analysis(report)
    # every step also has its grounding measured the diagnosis' ways; the rollout over the last 3 layers, minimum
    # over the step's tokens, is the G the step loop computed (there from a cached forward, here from a full one)
    for s in steps:
        assert s["g_variants"]["rollout3_min"] == pytest.approx(s["grounding"], abs=1e-4)
        assert len(s["g_variants"]["layer_mean"]) == tiny_engine.draft_lm.model.config.num_hidden_layers
    # rerun: nothing generated again, same analysis
    monkeypatch.setattr(tiny_engine, "generate", lambda *a, **k: pytest.fail("a finished problem ran again"))
    again = calibrate_specguard(tiny_engine, problems, cfg, progress=False, steps_file=steps_file)
    assert again["analysis"] == report["analysis"]
    # a resumed run with another margin labels the old records with the new one
    wide = calibrate_specguard(tiny_engine, problems, cfg, progress=False, steps_file=steps_file, margin=1e9)
    assert all(s["target_prefers"] for s in wide["steps"] if s["preference_gap"] is not None)


def test_specguard_defaults_are_the_committed_calibrations_choice():
    """The defaults come from `make calibrate-specguard`'s committed run, re-analysed from its step records."""
    from pathlib import Path

    from loosespec.config import DecodeConfig
    from loosespec.presets import SG_RULES

    rep = json.loads((Path(__file__).resolve().parents[2] / "results/calibration/specguard.json").read_text())
    assert {s["problem"].split("/")[0] for s in rep["steps"]} == {"gsm8k-train"} and len(rep["steps"]) >= 200
    choice = analyse_report(rep)["choice"]
    rule = SG_RULES[("embedding", "weighted")]
    assert (rule["sg_confidence"], rule["sg_beta"], rule["sg_tau"]) == (
        choice["sg_confidence"],
        choice["sg_beta"],
        choice["sg_tau"],
    )
    cfg = DecodeConfig(method="specguard")  # what an unset rule runs
    assert (cfg.sg_select, cfg.sg_decision, cfg.sg_tau, cfg.sg_beta) == ("embedding", "weighted", rule["sg_tau"], 0.8)


@pytest.mark.parametrize("select", ["embedding", "attention"])
def test_specguard_rules_are_the_held_out_calibrations_choices(select):
    """Every other rule is what the held-out calibration of its selection chose on its fit problems with SpecGuard's
    G (so its held-out scores are those of what ships), re-read from the committed step records."""
    from pathlib import Path

    from loosespec.eval.specguard_diag import BOTH_SHIPPED, WEIGHTED_SHIPPED, heldout
    from loosespec.presets import SG_RULES

    name = "specguard-heldout" if select == "embedding" else f"specguard-{select}-heldout"
    rep = json.loads((Path(__file__).resolve().parents[2] / f"results/calibration/{name}.json").read_text())
    assert rep["config"]["sg_select"] == select and rep["problems"] >= 70 and len(rep["steps"]) >= 300
    rules = heldout(rep["steps"])["rules"]
    weighted = SG_RULES[(select, "weighted")]
    if select != "embedding":  # embedding's weighted rule: the first calibration's (above)
        w = rules[WEIGHTED_SHIPPED]["choice"]
        assert weighted == {
            "sg_confidence": w["sg_confidence"],
            "sg_beta": w["sg_beta"],
            "sg_tau": w["sg_tau"],
            "sg_grounding_tau": None,
        }
    b = rules[BOTH_SHIPPED]["choice"]
    assert SG_RULES[(select, "both")] == {
        "sg_confidence": b["sg_confidence"],
        "sg_beta": weighted["sg_beta"],  # only weighs the S that step records report
        "sg_tau": b["tau_c"],
        "sg_grounding_tau": b["tau_g"],
    }
