"""BENCHMARKS.md's "Earlier runs" tables are typed in from results/speed_*.json and results/specguard_gsm8k.json
(measured by the runner the harness absorbed): every figure in them is recomputed here from the committed
per-prompt rows, with the harness's definitions (speedup = total ar wall time / total method wall time,
mean accepted length = all new tokens / all rounds)."""

import json
import re
from pathlib import Path

import pytest

from loosespec.eval.stats import pooled_mean_accepted_length

ROOT = Path(__file__).resolve().parents[2]


def section_tables(text: str | None = None) -> list[list[list[str]]]:
    text = text if text is not None else (ROOT / "BENCHMARKS.md").read_text()
    body = text[text.index("## Earlier runs") :]
    body = body[: body.index("\n## ", 1)]
    tables, cur = [], []
    for line in body.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if not set("".join(cells)) <= set("-: "):
                cur.append(cells)
        elif cur:
            tables.append(cur[1:])  # without the header
            cur = []
    return tables


def rows_of(name: str) -> list[dict]:
    return json.loads((ROOT / "results" / name).read_text())["rows"]


def figures(rows: list[dict], method: str, category: str | None = None) -> dict:
    pick = [r for r in rows if category in (None, r["category"])]
    ar = {(r["category"], r["id"]): r for r in pick if r["method"] == "ar"}
    mine = [r for r in pick if r["method"] == method]
    wall = sum(r["wall_s"] for r in mine)
    counted = [r for r in mine if r.get("rounds")]
    tau = pooled_mean_accepted_length([len(r["token_ids"]) for r in counted], [r["rounds"] for r in counted])
    steps = sum(r.get("steps") or 0 for r in mine)
    return {
        # the runner stored these rounded to 3 places; the tables print those to 2
        "speedup": f"{round(sum(r['wall_s'] for r in ar.values()) / wall, 3):.2f}x",
        "tok/s": f"{round(sum(len(r['token_ids']) for r in mine) / wall, 3):.2f}",
        "tau": "-" if tau is None else f"{tau:.2f}",
        "identical": f"{sum(r['token_ids'] == ar[(r['category'], r['id'])]['token_ids'] for r in mine)}/{len(mine)}",
        "target_forwards": str(sum(r.get("target_forwards") or 0 for r in mine)),
        "correct": f"{sum(bool(r.get('correct')) for r in mine)}/{len(mine)}",
        "step_accept": "-" if not steps else f"{sum(r['accepted_steps'] for r in mine) / steps:.2f}",
    }


def method_of(label: str) -> str:
    return re.split(r"[ ,]", label)[0]


def test_three_tables_are_there():
    assert len(section_tables()) == 3


def test_lossless_table_matches_its_rows():
    check_lossless(section_tables()[0])


def check_lossless(table):
    rows = rows_of("speed_lossless.json")
    assert {method_of(r[0]) for r in table} == {r["method"] for r in rows}
    for label, speedup, tps, tau, ident in table:
        f = figures(rows, method_of(label))
        assert [speedup, tps, tau, ident] == [f["speedup"], f["tok/s"], f["tau"], f["identical"]], label


def test_fly_table_matches_its_rows():
    rows = rows_of("speed_fly.json")
    for label, *per_cat, ident in section_tables()[1]:
        m = method_of(label)
        assert ("(lossy)" in label) == m.startswith("fly-"), label
        for cat, cell in zip(("humaneval", "summarization", "math_reasoning"), per_cat):
            f = figures(rows, m, cat)
            want = f["speedup"] if f["tau"] == "-" else f"{f['speedup']} ({f['tau']})"
            assert cell == want, (label, cat)
        assert ident == figures(rows, m)["identical"], label


def test_specguard_table_matches_its_rows():
    rows = rows_of("specguard_gsm8k.json")
    for label, speedup, tps, tau, fwd, correct, step in section_tables()[2]:
        f = figures(rows, method_of(label))
        assert [speedup, tps, tau, fwd, correct, step] == [
            f["speedup"],
            f["tok/s"],
            f["tau"],
            f["target_forwards"],
            f["correct"],
            f["step_accept"],
        ], label


@pytest.mark.parametrize(
    "typed,fault",
    [
        ("| exact-ngram | 1.09x | 2.13 | 5.11 |", "| exact-ngram | 1.10x | 2.13 | 5.11 |"),
        ("| exact-ngram | 1.09x | 2.13 | 5.11 |", "| exact-ngram | 1.09x | 2.13 | 5.12 |"),
    ],
)
def test_a_changed_figure_is_caught(typed, fault):
    text = (ROOT / "BENCHMARKS.md").read_text()
    assert typed in text
    with pytest.raises(AssertionError):
        check_lossless(section_tables(text.replace(typed, fault))[0])
