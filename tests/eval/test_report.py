"""The bench plots (:func:`loosespec.eval.report.plot`): the summary's 95% intervals are drawn, and no legend
covers data."""

from __future__ import annotations

import pytest

from loosespec.eval import report as RP
from loosespec.eval import stats as S
from loosespec.eval.bench_methods import BASELINE, is_lossy


def row(qid: int, method: str, cat: str, wall: float, score: bool, lengths: list[int]) -> dict:
    ids = list(range(sum(lengths)))
    drafted = 0 if method == BASELINE else 4 * len(lengths)
    return {
        "question_id": f"q{qid}",
        "category": cat,
        "method": method,
        "lossy": is_lossy(method),
        "wall_time": wall,
        "token_ids": ids,
        "new_tokens": len(ids),
        "rounds": len(lengths),
        "accept_lengths": lengths,
        "score": score,
        "drafted_tokens": drafted,
        "accepted_tokens": sum(lengths) - len(lengths),
        "stats": {}
        if method == BASELINE
        else {
            "num_drafted_per_pos": [len(lengths)] * 4,
            "num_accepted_tokens_per_pos": [sum(x > i + 1 for x in lengths) for i in range(4)],
        },
    }


def rows() -> list[dict]:
    out = []
    for q in range(12):
        cat = "a" if q < 6 else "b"
        out.append(row(q, "ar", cat, 10.0 + q, q % 3 != 0, [1] * 8))
        out.append(row(q, "exact-ngram", cat, 6.0 + (q % 4), q % 3 != 0, [3, 3, 2]))
        out.append(row(q, "fly-ngram", cat, 5.0 + (q % 5) * 0.7, q % 4 != 0, [4, 2, 2]))
    return out


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    """plot() on hand-made rows; each figure as it is saved (laid out and drawn), by file name."""
    figures = {}
    save = RP._save

    def keep(plt, fig, path):
        fig.tight_layout()
        fig.canvas.draw()
        figures[path.name] = fig
        return save(plt, fig, path)

    monkeypatch.setattr(RP, "_save", keep)
    summary = S.summarize(rows())
    RP.plot(rows(), summary, tmp_path)
    return summary, figures


def test_speedup_bars_carry_the_summarys_95_percent_intervals(drawn):
    summary, figures = drawn
    ax = figures["speedup_by_category.png"].axes[0]
    bars = [c for c in ax.containers if c.__class__.__name__ == "BarContainer"]
    assert [b.get_label() for b in bars] == ["exact-ngram", "fly-ngram (lossy)"]
    for bar, method in zip(bars, ("exact-ngram", "fly-ngram")):
        assert bar.errorbar is not None, f"{method}: no error bars"
        segments = bar.errorbar.lines[2][0].get_segments()  # one vertical segment per category
        for seg, cat in zip(segments, ("a", "b")):
            lo, hi = summary["categories"][cat][method]["speedup_ci95"]
            assert lo < hi
            assert sorted(y for _, y in seg) == pytest.approx([lo, hi])


def test_recovery_points_carry_both_intervals(drawn):
    from loosespec.eval.failures import summary_recovery_interval

    summary, figures = drawn
    ax = figures["recovery_vs_speedup.png"].axes[0]
    # ErrorbarContainer: (data line, caps, (bar lines per direction,)); a horizontal bar spans the speedup's
    # interval, a vertical one the recovery's
    # (a zero-length bar, which matplotlib still draws as a segment, is no interval: left out)
    segments = [
        seg for c in ax.containers for col in c.lines[2] for seg in col.get_segments() if (seg[0] != seg[1]).any()
    ]
    across = sorted(tuple(sorted(x for x, _ in seg)) for seg in segments if seg[0][1] == seg[1][1])
    up = sorted(tuple(sorted(y for _, y in seg)) for seg in segments if seg[0][0] == seg[1][0])
    methods = ("exact-ngram", "fly-ngram")
    assert across == [pytest.approx(w) for w in sorted(tuple(summary["methods"][m]["speedup_ci95"]) for m in methods)]
    # a lossless method whose every output is ar's has recovery 1 by construction: no vertical bar, not an estimate
    # (a lossy one keeps its interval: its sample's outputs say nothing certain of other problems)
    estimated = [m for m in methods if summary["methods"][m]["lossy"] or summary["methods"][m]["identical_to_ar"] < 1]
    assert summary["methods"]["exact-ngram"]["identical_to_ar"] == 1 and estimated == ["fly-ngram"]
    want = sorted(tuple(summary_recovery_interval(summary["methods"][m])) for m in estimated)
    assert all(lo < hi for lo, hi in want)
    assert up == [pytest.approx(w) for w in want]


def test_recovery_picture_draws_flys_099_line_and_names_it_in_the_legend(drawn):
    from loosespec.eval.failures import KEEP

    _, figures = drawn
    ax = figures["recovery_vs_speedup.png"].axes[0]
    # axhline: two points across the axes at KEEP (a method's point is one point, whatever its recovery)
    flat = [ln for ln in ax.get_lines() if list(ln.get_ydata()) == [KEEP, KEEP]]
    assert len(flat) == 1, "the 0.99 line is drawn once"
    legend = ax.get_legend()
    assert flat[0].get_label() in [t.get_text() for t in legend.get_texts()]
    # named in the legend, not in a label over the points
    assert [t.get_text() for t in ax.texts] == []


def test_acceptance_by_position_carries_a_wilson_band_per_method(drawn):
    from loosespec.eval.stats import acceptance_counts_by_position, wilson

    _, figures = drawn
    ax = figures["acceptance_by_position.png"].axes[0]
    bands = [c for c in ax.collections if c.__class__.__name__ in ("FillBetweenPolyCollection", "PolyCollection")]
    counts = acceptance_counts_by_position(rows())
    assert len(bands) == len(counts) == 2
    for band, (method, per_pos) in zip(bands, counts.items()):
        ys = band.get_paths()[0].vertices[:, 1]
        lows = [wilson(a, d)[0] for a, d in per_pos]
        highs = [wilson(a, d)[1] for a, d in per_pos]
        assert min(ys) == pytest.approx(min(lows)) and max(ys) == pytest.approx(max(highs)), method


def test_no_legend_covers_the_axes(drawn):
    _, figures = drawn
    legends = 0
    for name, fig in figures.items():
        for ax in fig.axes:
            leg = ax.get_legend()
            if leg is None:
                continue
            legends += 1
            box, frame = leg.get_window_extent(), ax.get_window_extent()
            assert box.x0 >= frame.x1, f"{name}: the legend overlaps the plotting area"
    assert legends >= 3  # speedup by category, accepted lengths, acceptance by position
