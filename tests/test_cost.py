"""The measured cost model: interpolation, measurement with a fake clock, caching per machine."""

import json
from types import SimpleNamespace

import pytest
import torch

from loosespec import cost
from loosespec.cost import CostCurve, cost_curve, format_curve, measure, monotone


class FakeLM:
    """Stands in for a CachedLM: each forward advances a fake clock by c(n) for the n tokens it feeds."""

    def __init__(self, clock, c):
        self.clock, self.c = clock, c
        self.model = SimpleNamespace(config=SimpleNamespace(vocab_size=500))
        self.device = torch.device("cpu")
        self.fed = []
        self.reset()

    def reset(self):
        self.cached = 0

    def logits(self, seq, rows):
        keep = min(self.cached, seq.shape[0] - rows)
        n = seq.shape[0] - keep
        self.fed.append(n)
        self.clock.t += self.c(n)
        self.cached = seq.shape[0]
        return torch.zeros(rows, 500)


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def test_interpolation_and_extrapolation():
    c = CostCurve((1, 4, 16), (0.1, 0.13, 0.25))
    assert c(1) == 0.1 and c(4) == pytest.approx(0.13) and c(16) == pytest.approx(0.25)
    assert c(2) == pytest.approx(0.11)
    assert c(20) == pytest.approx(0.25 + 4 * 0.01)  # the last segment's slope
    assert c.ratio(16) == pytest.approx(2.5)
    assert "| 16 | 250.0 | 2.50 |" in format_curve(c)


def test_bad_curves_are_refused():
    with pytest.raises(ValueError):
        CostCurve((4, 1), (0.1, 0.2))
    with pytest.raises(ValueError):
        CostCurve((), ())


def test_monotone_pools_noise():
    assert monotone([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert monotone([1.0, 2.0]) == [1.0, 2.0]


def test_measure_times_each_n_after_a_cached_context():
    clock = Clock()
    true = lambda n: 0.05 + 0.01 * n  # noqa: E731
    lm = FakeLM(clock, true)
    curve = measure(lm, 16, context=32, timer=clock)
    assert curve.ns[0] == 1 and curve.ns[-1] == 16
    for n in curve.ns:
        assert curve(n) == pytest.approx(true(n))
    assert lm.fed[0] == 32  # the context, then three warm-up forwards, then only the timed n
    assert set(lm.fed[4:]) == set(curve.ns) and len(lm.fed[4:]) == 5 * len(curve.ns)


def test_cost_curve_is_cached_per_machine_and_refreshable(tmp_path, monkeypatch):
    clock = Clock()
    calls = []

    def fake_measure(lm, max_n, **kw):
        calls.append(max_n)
        return CostCurve((1, max_n), (0.1, 0.2))

    monkeypatch.setattr(cost, "measure", fake_measure)
    loaded = SimpleNamespace(
        source=SimpleNamespace(spec="m", revision="r"), precision=None, model=torch.nn.Linear(2, 2)
    )
    lm = FakeLM(clock, lambda n: 0.0)
    a = cost_curve(loaded, lm, 16, cache_dir=tmp_path)
    b = cost_curve(loaded, lm, 16, cache_dir=tmp_path)
    assert calls == [16] and a == b
    assert b.meta["cpu"] and "cpu_flags" in b.meta and b.meta["model"] == "m"
    cost_curve(loaded, lm, 8, cache_dir=tmp_path)  # a shorter range is covered by the cached curve
    assert calls == [16]
    cost_curve(loaded, lm, 32, cache_dir=tmp_path)  # a longer one is measured
    assert calls == [16, 32]
    cost_curve(loaded, lm, 16, cache_dir=tmp_path, refresh=True)
    assert calls == [16, 32, 16]
    (path,) = tmp_path.glob("*.json")
    path.write_text("{torn")
    cost_curve(loaded, lm, 16, cache_dir=tmp_path)
    assert calls == [16, 32, 16, 16]
    assert json.loads(path.read_text())["ns"] == [1, 16]
