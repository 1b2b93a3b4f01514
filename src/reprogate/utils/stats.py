"""Scores and their uncertainty: per-class F1, bootstrap intervals of one model (evaluate), and
paired comparisons of two models on the same items (the report), which a reviewer needs to tell
a real change from resampling noise.

The paired tests pair by item: each resample (bootstrap) or each discordant item (McNemar) takes the
two models' answers to the same query together, which is far more sensitive than comparing two
independent intervals, and is the honest test when the held-out set is the same.
"""

from __future__ import annotations

import math

import numpy as np

RESAMPLES = 1000


def per_class(
    gold: np.ndarray, pred: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Precision, recall, F1 and support of each of the `n` classes."""
    # Classes >= n (the out-of-scope class) count as wrong predictions for every intent.
    tp = np.bincount(gold[gold == pred], minlength=n)[:n].astype(float)
    support = np.bincount(gold, minlength=n)[:n].astype(float)
    predicted = np.bincount(pred, minlength=n)[:n].astype(float)
    precision = np.divide(tp, predicted, out=np.zeros(n), where=predicted > 0)
    recall = np.divide(tp, support, out=np.zeros(n), where=support > 0)
    f1 = np.divide(2 * precision * recall, precision + recall, out=np.zeros(n), where=precision + recall > 0)
    return precision, recall, f1, support


def macro_f1(gold: np.ndarray, pred: np.ndarray, n: int) -> float:
    """Mean F1 over the classes present in `gold`."""
    _, _, f1, support = per_class(gold, pred, n)
    return float(f1[support > 0].mean())


def _ci95(xs: list[float]) -> list[float]:
    return [float(np.percentile(xs, 2.5)), float(np.percentile(xs, 97.5))]


def bootstrap_ci(gold: np.ndarray, pred: np.ndarray, n: int, seed: int = 0) -> dict[str, list[float]]:
    """95% percentile intervals of one model's accuracy and macro-F1 over resampled items."""
    rng = np.random.default_rng(seed)
    acc, f1 = [], []
    for _ in range(RESAMPLES):
        i = rng.integers(0, len(gold), len(gold))
        acc.append(float((gold[i] == pred[i]).mean()))
        f1.append(macro_f1(gold[i], pred[i], n))
    return {"accuracy_ci95": _ci95(acc), "macro_f1_ci95": _ci95(f1)}


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
    return {"accuracy": _ci95(acc), "macro_f1": _ci95(f1)}


def mcnemar(base_right: np.ndarray, head_right: np.ndarray) -> dict[str, float | int]:
    """Exact McNemar test: of the items exactly one model gets right, is the split 50/50?"""
    fixed = int((~base_right & head_right).sum())
    broken = int((base_right & ~head_right).sum())
    p = binomial_half_p(fixed, fixed + broken)
    return {
        "items": len(base_right),
        "fixed": fixed,
        "broken": broken,
        "both_right": int((base_right & head_right).sum()),
        "both_wrong": int((~base_right & ~head_right).sum()),
        "p_value": float(p),
    }


def binomial_half_p(k: int, n: int) -> float:
    """Two-sided exact p of k successes in n fair trials: twice the smaller tail, in integers
    (the binomial is symmetric at 1/2, so this is what scipy's binomtest gives), without the
    second scipy import costs a command."""
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1))
    return min(1.0, 2 * tail / 2**n)
