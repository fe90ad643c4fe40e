"""The scripts that turn result files into BENCHMARKS.md's speed checks and precision comparison."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from cpu_acceptance import report  # noqa: E402
from precision_accuracy import compare  # noqa: E402

from loosespec.eval.stats import mcnemar_exact  # noqa: E402


def test_mcnemar_exact():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(0, 5) == pytest.approx(2 / 32)
    assert mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(1, 9) == pytest.approx(2 * 11 / 1024)


def write_set(d: Path, methods: dict, dataset="humaneval", dtype="int8"):
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"methods": methods}))
    (d / "config.json").write_text(
        json.dumps(
            {
                "target": "t",
                "draft": "d",
                "dtype": dtype,
                "dataset": dataset,
                "max_new_tokens": 128,
                "adaptive_draft_length": True,
            }
        )
    )
    (d / "results.jsonl").write_text(
        json.dumps({"hardware": {"cpu": "Test CPU", "cpu_flags": ["avx2"], "threads": 2}}) + "\n"
    )


def m(speedup, tps, ident=1.0, lossy=False):
    return {
        "prompts": 5,
        "speedup": speedup,
        "tokens_per_s": tps,
        "mean_accepted_length": 2.0,
        "identical_to_ar": ident,
        "lossy": lossy,
    }


def test_cpu_report_passes_and_fails_where_it_should(tmp_path):
    write_set(
        tmp_path / "humaneval",
        {"ar": m(1, 8), "exact-ngram": m(1.5, 12), "fly-ngram": m(2.5, 20, 0.8, True), "llamacpp-ar": m(1.1, 9)},
    )
    write_set(
        tmp_path / "specbench-summarization",
        {"ar": m(1, 8), "exact-ngram": m(1.4, 11), "fly-ngram": m(2.0, 16, 0.6, True), "llamacpp-ar": m(1.1, 9)},
    )
    text, ok = report(tmp_path)
    assert ok, text
    assert "Test CPU (avx2; 2 threads)" in text and "PASS: best FLy configuration (fly-ngram)" in text
    write_set(
        tmp_path / "specbench-math_reasoning",
        {"ar": m(1, 8), "exact-ngram": m(0.9, 7, 0.8), "fly-ngram": m(1.0, 8, 0.5, True), "llamacpp-ar": m(1.1, 9)},
    )
    text, ok = report(tmp_path)
    assert not ok
    assert (
        "FAIL: every loosespec method >= 0.95x ar in every category (lowest: exact-ngram on "
        "specbench-math_reasoning, 0.90x)" in text
    )
    assert "FAIL: lossless exact-ngram identical to ar" in text


def test_precision_compare(tmp_path):
    def rows(d, dtype, scores, ids_same):
        d.mkdir()
        (d / "config.json").write_text(
            json.dumps({"dataset": "gsm8k", "target": "t", "dtype": dtype, "max_new_tokens": 8})
        )
        lines = [
            json.dumps(
                {
                    "question_id": f"q{i}",
                    "method": "ar",
                    "score": s,
                    "token_ids": [i] if ids_same[i] else [dtype],
                    "new_tokens": 8,
                    "wall_time": 1.0,
                    "hardware": {"cpu": "Test CPU", "cpu_flags": []},
                }
            )
            for i, s in enumerate(scores)
        ]
        (d / "results.jsonl").write_text("\n".join(lines) + "\n")

    rows(tmp_path / "a", "int8", [True, True, False, True], [1, 0, 1, 1])
    rows(tmp_path / "b", "float32", [True, False, False, False], [1, 0, 1, 1])
    text = compare(tmp_path / "a", tmp_path / "b")
    assert "| int8 | 3/4 = 0.75" in text and "| float32 | 1/4 = 0.25" in text
    assert "right in int8 only: 2; right in float32 only: 0" in text
    assert "identical token for token: 3/4" in text
    assert "on all" not in text  # both sides have the same problems
    (tmp_path / "a" / "results.jsonl").open("a").write(
        json.dumps(
            {"question_id": "q9", "method": "ar", "score": False, "token_ids": [9], "new_tokens": 8, "wall_time": 1.0}
        )
        + "\n"
    )
    assert "int8 on all 5 problems it has scored: 3/5 = 0.60" in compare(tmp_path / "a", tmp_path / "b")


def test_pooled_mean_accepted_length_is_all_tokens_over_all_rounds():
    """One definition, the harness's: all tokens / all rounds, not the mean of per-prompt values (which for
    8 tokens in 2 rounds and 3 in 3 would be (4 + 1) / 2 = 2.5, not 11 / 5 = 2.2)."""
    from loosespec.eval.stats import pooled_mean_accepted_length

    assert pooled_mean_accepted_length([8, 3], [2, 3]) == pytest.approx(11 / 5)
    assert pooled_mean_accepted_length([8, 2], [2, 2]) == 2.5 and pooled_mean_accepted_length([], []) is None


def test_gpu_smoke_runs_its_cpu_sections_and_writes_one_summary(tmp_path):
    """benchmarks/gpu_smoke.py (docs/gpu.md) on the CPU: the sections that need neither the prepared assets nor
    minutes (env, the 64-request vLLM V2 rule batch, device vs CPU) run and land in one JSON summary; a missing
    asset folder fails its own section, not the run."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "smoke.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(root / "benchmarks" / "gpu_smoke.py"),
            "run",
            "--device",
            "cpu",
            "--skip",
            "tests,matrix,rule_cost,syncs,peak_memory",
            "--assets",
            str(tmp_path / "none"),
            "--vllm-vocab",
            "512",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary = json.loads(out.read_text())
    s = summary["sections"]
    assert s["env"]["ok"] and s["env"]["dependencies"]["transformers"]["in_range"] is True, proc.stderr[-2000:]
    from loosespec.hardware import cpu_info

    assert s["env"]["host"]["cpu"] == cpu_info().model and s["env"]["host"]["device"] == "cpu"
    assert s["models"]["ok"] is False and "prepare" in s["models"]["error"]
    assert s["vllm_rule"]["ok"] and s["vllm_rule"]["greedy_equal_to_cpu"] and s["vllm_rule"]["requests"] == 64
    assert summary["failed_sections"] == ["models"] and proc.returncode == 1


def write_fly_set(d: Path, categories: dict, rows: list):
    """A bench directory as fly_acceptance.py reads it: summary per category, config, rows."""
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"methods": {}, "categories": categories}))
    (d / "config.json").write_text(json.dumps({"target": "t", "draft": "d", "dtype": "int8"}))
    hw = {"cpu": "Test CPU", "cpu_flags": ["avx2"], "threads": 2}
    (d / "results.jsonl").write_text("\n".join(json.dumps({**r, "hardware": hw}) for r in rows) + "\n")


def fly_cat(n, ar, exact, fly, **extra):
    base = {"prompts": n, "identical_to_ar": 1.0, "draft_levels": {"lookup": 0.5, "model": 0.4, "none": 0.1}}
    return {
        "ar": {**base, "tokens_per_s": ar},
        "exact-mla": {**base, "tokens_per_s": exact, "mean_accepted_length": 2.5},
        "fly-mla": {
            **base,
            "tokens_per_s": fly,
            "mean_accepted_length": 3.25,
            "identical_to_ar": 0.5,
            "fly_deferrable_rounds": 30,
            "level_rounds": 100,
            "fly_deferred": 4,
            **extra,
        },
    }


def test_fly_acceptance_checks_speed_retention_and_size(tmp_path):
    from fly_acceptance import report as fly_report

    cats = {f"c{i}": fly_cat(10, 4.0, 5.0, 6.0) for i in range(6)}
    write_fly_set(tmp_path / "specbench", cats, [{"method": "ar", "category": "c0"}])

    def row(method, i, score):
        return {
            "method": method,
            "lossy": method != "ar",
            "category": "humaneval",
            "question_id": f"q{i}",
            "score": score,
            "token_ids": [i],
            "new_tokens": 8,
            "wall_time": 1.0,
            "rounds": 4,
            "stats": {},
        }

    he_rows = [row("ar", i, i < 20) for i in range(40)] + [row("fly-mla", i, i < 20) for i in range(40)]
    he = fly_cat(
        40,
        4.0,
        5.0,
        6.0,
        scored=40,
        recovery=1.0,
        ar_right_method_wrong=0,
        ar_wrong_method_right=0,
        accuracy=0.5,
        ar_accuracy=0.5,
        mcnemar_p=1.0,
    )
    write_fly_set(tmp_path / "humaneval", {"humaneval": he}, he_rows)
    text, ok = fly_report(tmp_path)
    assert ok, text
    assert (
        "PASS: FLy's default >= 1.10x exact's default in tokens/s, geometric mean over the 7 categories (1.200x)"
        in text
    )
    assert "retention 1.000, 95% interval " in text and ": 0 lost, 0 gained" in text and "partial" not in text
    assert "| c0 | 10 | 4.00 | 5.00 | 6.00 | 1.200x | 0.50 | 30 of 100 | 4 | 2.50 / 3.25 | 50% / 40% / 10% |" in text
    assert "Other FLy settings" not in text  # no variant ran

    # a variant beside the default (the paper preset) gets its own table against exact, outside the checks
    paper = {
        "prompts": 10,
        "tokens_per_s": 2.5,
        "identical_to_ar": 0.2,
        "fly_deferred": 9,
        "mean_accepted_length": 7.0,
    }
    with_paper = {c: {**per, "fly-mla@fly_preset=paper": paper} for c, per in cats.items()}
    (tmp_path / "specbench" / "summary.json").write_text(json.dumps({"methods": {}, "categories": with_paper}))
    text, ok = fly_report(tmp_path)
    assert ok, text
    assert "| c0 | fly_preset=paper | 10 | 2.50 | 0.500x | 0.20 | 9 | 7.00 | - |" in text
    (tmp_path / "specbench" / "summary.json").write_text(json.dumps({"methods": {}, "categories": cats}))

    # too slow in one category drags the geometric mean below the bar
    cats["c0"] = fly_cat(10, 4.0, 5.0, 2.0)
    (tmp_path / "specbench" / "summary.json").write_text(json.dumps({"methods": {}, "categories": cats}))
    text, ok = fly_report(tmp_path)
    assert not ok and "FAIL: FLy's default >= 1.10x" in text

    # a partial run decides nothing, even when every check passes
    small = {f"c{i}": fly_cat(2, 4.0, 5.0, 6.0) for i in range(6)}
    (tmp_path / "specbench" / "summary.json").write_text(json.dumps({"methods": {}, "categories": small}))
    text, ok = fly_report(tmp_path)
    assert not ok and "partial run: 12 of the issue's 60 Spec-Bench prompts and 40 of its 40" in text
