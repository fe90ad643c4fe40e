"""Method variants (``<method>@<knob>=<value>``) and ``bench --sweep``: a knob's effect measured by runs,
and plotted from them (speedup, and accuracy on a scored set, against the knob's value)."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli as cli
from test_bench import bench_args, row

from loosespec.errors import LoosespecError
from loosespec.eval import bench_methods as M
from loosespec.eval import report as RP
from loosespec.eval import results as R
from loosespec.eval import stats as S


def cfg(name):
    return M.method_config(name, max_new_tokens=16, temperature=0.0, seed=0, has_draft=False)


def test_a_variant_sets_its_knob_and_keeps_its_method():
    m = M.bench_method("fly-ngram@num_draft_tokens=5@fly_entropy_threshold=0.6")
    assert (m.method.name, m.drafter.name, m.lossy) == ("fly", "ngram", True)  # parsed once, into the objects
    c = cfg(m.name)
    assert (c.num_draft_tokens, c.fly_entropy_threshold) == (5, 0.6)
    assert cfg("fly-ngram").num_draft_tokens != 5  # the plain name keeps the defaults
    assert M.bench_method("exact-ngram@num_draft_tokens=4").lossy is False
    # a preset's own settings survive a variant of it
    assert cfg("specguard-regenerate@sg_candidates=2").sg_on_reject == "regenerate"
    assert M.variant_knobs("fly-ngram@num_draft_tokens=5") == {"num_draft_tokens": "5"}
    assert M.base_name("fly-ngram@num_draft_tokens=5") == "fly-ngram"


@pytest.mark.parametrize(
    "name,says",
    [
        ("fly-ngram@nope=3", "not <knob>=<value>"),
        ("fly-ngram@num_draft_tokens", "not <knob>=<value>"),
        ("fly-ngram@temperature=0.7", "per-method knob"),  # the run's settings are the same for every method
        ("fly-ngram@num_draft_tokens=-1", "num_draft_tokens"),  # the schema's own check, naming the field
        ("fly-ngram@fly_entropy_threshold=0.005", "ambiguous"),
        ("hf-pld@num_draft_tokens=5", "peer"),
        ("nosuch@num_draft_tokens=5", "unknown method"),
    ],
)
def test_bad_variants_are_clear_errors(name, says):
    with pytest.raises(LoosespecError, match=says):
        M.parse_methods(["ar", name])


def test_sweep_expands_loosespec_methods_and_keeps_ar_and_peers():
    got = M.sweep_methods(["ar", "fly-ngram", "hf-pld"], "num_draft_tokens", ["5", "10"])
    assert got == ["ar", "fly-ngram@num_draft_tokens=5", "fly-ngram@num_draft_tokens=10", "hf-pld"]


def test_sweeps_group_variants_by_knob_and_sort_by_value():
    names = [
        "ar",
        "fly-ngram@num_draft_tokens=10",
        "fly-ngram@num_draft_tokens=5",
        "exact-ngram@num_draft_tokens=5",
        "fly-mla@fly_sampling=rejection",
        "fly-mla@fly_sampling=two-sample",
    ]
    # exact-ngram has one value (no line), fly_sampling is categorical (no axis)
    assert RP.sweeps(names) == {
        "num_draft_tokens": {
            "fly-ngram": [(5.0, "fly-ngram@num_draft_tokens=5"), (10.0, "fly-ngram@num_draft_tokens=10")]
        }
    }


def test_sweep_plot_draws_every_run_and_nothing_else(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.axes import Axes

    drawn = []
    real = Axes.errorbar
    monkeypatch.setattr(
        Axes,
        "errorbar",
        lambda self, x, y, *a, **k: drawn.append((self, list(x), list(y))) or real(self, x, y, *a, **k),
    )
    a, b = "fly-ngram@fly_entropy_threshold=0.3", "fly-ngram@fly_entropy_threshold=0.6"
    rows = [
        row("q1", "ar", 10.0, [1, 2], True),
        row("q1", a, 5.0, [1, 2], True, rounds=1),
        row("q1", b, 4.0, [1, 3], False, rounds=1),
    ]
    summary = S.summarize(rows)
    paths = RP.plot(rows, summary, tmp_path)
    assert tmp_path / "speedup_by_fly_entropy_threshold.png" in paths
    # the sweep's axes (the other plots draw their own error bars: intervals, bars' and points')
    assert [(x, y) for ax, x, y in drawn if ax.get_title().startswith("Speedup against")] == [([0.3, 0.6], [2.0, 2.5])]


def test_bench_sweep_runs_each_value_and_plots_it(tiny_dir, tmp_path):
    out = tmp_path / "sweep"
    cmd = bench_args(tiny_dir, out, limit=1, tokens=12, methods="ar,fly-ngram")
    cmd.remove("--no-plots")
    r = cli(*cmd, "--sweep", "num_draft_tokens=2,4")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(x) for x in (out / R.RESULTS).read_text().splitlines()]
    assert sorted(x["method"] for x in rows) == ["ar", "fly-ngram@num_draft_tokens=2", "fly-ngram@num_draft_tokens=4"]
    assert all(x["lossy"] for x in rows if x["method"] != "ar")
    assert (out / "speedup_by_num_draft_tokens.png").exists()
    bad = cli(*cmd, "--sweep", "num_draft_tokens")
    assert bad.returncode == 2 and "--sweep takes" in bad.stderr and "Traceback" not in bad.stderr
