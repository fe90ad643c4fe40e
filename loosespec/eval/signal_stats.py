"""How well a score separates two labels, and a threshold on it: the statistics SpecGuard's calibration
(:mod:`loosespec.eval.calibrate`) and its grounding diagnosis (:mod:`loosespec.eval.specguard_diag`) share."""

from __future__ import annotations

from collections.abc import Sequence


def roc_auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """P(score of a random agreeing step > score of a random disagreeing one), ties count half: the
    Mann-Whitney U of the agreeing steps over the number of pairs (scipy)."""
    import numpy as np

    from loosespec.extras import import_extra

    mannwhitneyu = import_extra("scipy.stats", "the calibration's ROC AUC").mannwhitneyu

    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    pos, neg = s[y], s[~y]
    if not len(pos) or not len(neg):
        return None
    return float(mannwhitneyu(pos, neg, method="asymptotic").statistic / (len(pos) * len(neg)))


def auc_ci95(
    scores: Sequence[float],
    labels: Sequence[bool],
    groups: Sequence[str],
    resamples: int = 1000,
    bootstrap_seed: int = 0,
) -> tuple[float, float] | None:
    """95% interval of :func:`roc_auc` by a bootstrap over ``groups`` (problems: the steps of one problem
    are not independent), percentile method, seeded."""
    import numpy as np

    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    names = sorted(set(groups))
    index = {g: np.flatnonzero(np.asarray(groups) == g) for g in names}
    rng = np.random.default_rng(bootstrap_seed)
    values = []
    for _ in range(resamples):
        rows = np.concatenate([index[names[i]] for i in rng.integers(0, len(names), len(names))])
        auc = roc_auc(s[rows], y[rows])
        if auc is not None:
            values.append(auc)
    if len(values) < resamples / 2:
        return None
    lo, hi = np.percentile(values, [2.5, 97.5])
    return round(float(lo), 4), round(float(hi), 4)


def propose_tau(scores: Sequence[float], labels: Sequence[bool], accept_rate: float | None = None) -> dict:
    """tau accepting ``accept_rate`` of the steps (the highest-scoring ones), with its quality.

    >>> propose_tau([0.9, 0.8, 0.4, 0.2], [True, True, False, False], 0.5)["tau"]
    0.8
    """
    if not scores:
        raise ValueError("no scored steps to calibrate on")
    agree_rate = sum(labels) / len(labels)
    rate = agree_rate if accept_rate is None else accept_rate
    ranked = sorted(scores, reverse=True)
    n_accept = round(rate * len(ranked))
    tau = ranked[n_accept - 1] if n_accept > 0 else ranked[0] + 1e-6  # accepted iff S >= tau
    accepted = [y for s, y in zip(scores, labels) if s >= tau]
    return {
        "tau": round(tau, 6),
        "requested_accept_rate": round(rate, 4),
        "accept_rate": round(len(accepted) / len(scores), 4),
        "precision": round(sum(accepted) / len(accepted), 4) if accepted else None,  # accepted steps that agree
        "recall": round(sum(accepted) / sum(labels), 4) if sum(labels) else None,  # agreeing steps accepted
        "agree_rate": round(agree_rate, 4),
        "roc_auc": None if (auc := roc_auc(scores, labels)) is None else round(auc, 4),
    }


def rank_correlation(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rho (average ranks for ties, scipy); None when either side is constant or there are < 3
    pairs."""
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    from loosespec.extras import import_extra

    spearmanr = import_extra("scipy.stats", "the calibration's rank correlation").spearmanr

    return round(float(spearmanr(xs, ys).statistic), 4)
