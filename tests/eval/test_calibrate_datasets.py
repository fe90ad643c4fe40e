"""GSM8K answer extraction and loading; SpecGuard's tau proposal."""

import json

import pytest

from loosespec.errors import LoosespecError
from loosespec.eval.calibrate import propose_tau, roc_auc
from loosespec.eval.datasets import load_dataset
from loosespec.eval.scoring import is_correct


def test_is_correct_compares_numbers():
    assert is_correct("The answer is 18.00.", "18")
    assert is_correct("The answer is 1,000", "1,000")
    assert not is_correct("The answer is 17", "18")
    assert not is_correct("nothing", "18")


def test_load_gsm8k_from_a_data_dir(tmp_path):
    rows = [
        {"question": "What is 2 + 3?", "answer": "2 + 3 = <<2+3=5>>5\n#### 5"},
        {"question": "What is 10 * 100?", "answer": "#### 1,000"},
    ]
    (tmp_path / "gsm8k_test.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    probs = load_dataset("gsm8k", limit=5, directory=tmp_path)
    assert [p.answer for p in probs] == ["5", "1,000"]
    assert probs[0].id == "gsm8k/0" and "What is 2 + 3?" in probs[0].prompt and "The answer is" in probs[0].prompt
    assert len(load_dataset("gsm8k", limit=1, directory=tmp_path)) == 1
    with pytest.raises(LoosespecError, match="unknown dataset"):
        load_dataset("gsm9k", directory=tmp_path)
    (tmp_path / "empty").mkdir()  # a folder without the file: the shipped copy
    assert len(load_dataset("gsm8k", directory=tmp_path / "empty")) == 1319
    with pytest.raises(LoosespecError, match="is not a folder"):  # a mistyped --data-dir is never skipped
        load_dataset("gsm8k", directory=tmp_path / "missing")


def test_propose_tau_hits_the_requested_rate():
    scores = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
    labels = [True, True, False, True, False, False, False, False]
    p = propose_tau(scores, labels, 0.25)
    assert (
        p["tau"] == 0.8
        and p["accept_rate"] == 0.25
        and p["precision"] == 1.0
        and p["recall"] == pytest.approx(2 / 3, abs=1e-4)
    )
    p = propose_tau(scores, labels)  # default: the agreement rate, 3/8
    assert p["requested_accept_rate"] == 0.375 and p["tau"] == 0.7 and p["precision"] == pytest.approx(2 / 3, abs=1e-4)
    assert roc_auc(scores, labels) == pytest.approx(14 / 15)  # 15 (agree, disagree) pairs; 0.6 < 0.7 is the one wrong
    assert roc_auc([0.5, 0.5], [True, False]) == 0.5
    assert roc_auc([0.5], [True]) is None
    with pytest.raises(ValueError):
        propose_tau([], [])


@pytest.mark.parametrize(
    "command",
    [["bench", "--dataset", "gsm8k", "--out", "unused", "--methods", "ar"], ["calibrate", "--dataset", "gsm8k"]],
)
def test_data_dir_option_of_bench_and_calibrate(tmp_path, command, monkeypatch):
    """--data-dir reaches the loader: a folder that is not there stops the command before any model loads."""
    from conftest import run_cli

    monkeypatch.chdir(tmp_path)
    r = run_cli(*command, "--data-dir", tmp_path / "nowhere")
    assert r.returncode == 2 and "loosespec: error: --data-dir" in r.stderr and "is not a folder" in r.stderr, r
    assert not (tmp_path / "unused").exists()
