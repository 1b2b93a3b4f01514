"""Paired comparisons of two models on the same items: what a reviewer needs to tell a real
change from resampling noise.

Both tests pair by item: each resample (bootstrap) or each discordant item (McNemar) takes the
two models' answers to the same query together, which is far more sensitive than comparing two
independent intervals, and is the honest test when the held-out set is the same.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import binomtest

RESAMPLES = 1000


def macro_f1(gold: np.ndarray, pred: np.ndarray, classes: int) -> float:
    """Mean F1 over the classes present in `gold` (a prediction outside them counts as wrong)."""
    tp = np.bincount(gold[gold == pred], minlength=classes).astype(float)
    support = np.bincount(gold, minlength=classes).astype(float)
    predicted = np.bincount(pred, minlength=classes)[:classes].astype(float)
    denom = support + predicted
    f1 = np.divide(2 * tp, denom, out=np.zeros(classes), where=denom > 0)
    return float(f1[support > 0].mean())


def paired_bootstrap(
    gold: np.ndarray, base: np.ndarray, head: np.ndarray, classes: int, seed: int = 0
) -> dict[str, list[float]]:
    """95% percentile intervals of head minus base, in accuracy and macro-F1, over resamples of
    the items (the same resampled items for both models)."""
    rng = np.random.default_rng(seed)
    n = len(gold)
    acc, f1 = [], []
    right_b, right_h = base == gold, head == gold
    for _ in range(RESAMPLES):
        i = rng.integers(0, n, n)
        acc.append(float(right_h[i].mean() - right_b[i].mean()))
        f1.append(macro_f1(gold[i], head[i], classes) - macro_f1(gold[i], base[i], classes))
    q = lambda xs: [float(np.percentile(xs, 2.5)), float(np.percentile(xs, 97.5))]  # noqa: E731
    return {"accuracy": q(acc), "macro_f1": q(f1)}


def mcnemar(base_right: np.ndarray, head_right: np.ndarray) -> dict[str, float | int]:
    """Exact McNemar test: of the items exactly one model gets right, is the split 50/50?"""
    fixed = int((~base_right & head_right).sum())
    broken = int((base_right & ~head_right).sum())
    p = binomtest(fixed, fixed + broken, 0.5).pvalue if fixed + broken else 1.0
    return {
        "items": len(base_right),
        "fixed": fixed,
        "broken": broken,
        "both_right": int((base_right & head_right).sum()),
        "both_wrong": int((~base_right & ~head_right).sum()),
        "p_value": float(p),
    }
