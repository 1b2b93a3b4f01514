"""How much would more training data help? A learning curve that never reads the test set.

    make bench-learning-curve      # or: python bench/learning_curve.py [--models ngram minilm_frozen]

The default pipeline trains on 80% of deduplicated upstream train; the validation and
calibration partitions hold the rest. This pools those three partitions (every labelled query
except the held-out test), cuts them into 10 label-stratified folds, and for each fold trains
each model on nested random subsets of the other nine (50%, 65%, 80% and 90% of the pool),
with the product's own trainer, spec and cached features, plus the spec's negatives. Every
pooled query is then predicted once per size by a model that never saw it, so each point is
measured on all of the pool (about 10,000 queries), and two sizes are compared on the same
queries. Reported per size: each member's accuracy and their combination's (weighted
log-probabilities, with the ensemble's fitted weights from metrics/<ensemble>/train.json when
present), the 80% -> 90% gain with a paired 95% bootstrap interval, and a power-law
extrapolation to 100%. Each fold's models also predict real_dev (everyday phrasings no writer of
the pool wrote; never a training row): per size, their mean accuracy there, with a 95% bootstrap
interval over its queries. Needs `make repro` first (prepared data and features). About 13
minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from reprogate.data.prepared import Example, TrainData
from reprogate.models.base import concat, predict_logits
from reprogate.train import run as training
from reprogate.train.trainer import total_steps as steps_for
from reprogate.utils.jsonl import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
POOL = ("train", "validation", "calibration")
ALSO = "real_dev"  # scored by every fold's model too: how phrasings no pool writer used move with size
SIZES = (0.5, 0.65, 0.8, 0.9)
FOLDS = 10


def folds(y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Label-stratified fold of every row."""
    out = np.empty(len(y), int)
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        out[idx] = (np.arange(len(idx)) + rng.integers(FOLDS)) % FOLDS
    return out


def plan(y: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's fold, and the order rows join a training set in: a smaller training set is a
    prefix of a larger one (of the rows outside the held-out fold)."""
    rng = np.random.default_rng(seed)
    fold = folds(y, rng)
    return fold, rng.permutation(len(y))


def training_rows(fold: np.ndarray, order: np.ndarray, k: int, size: float) -> np.ndarray:
    return order[fold[order] != k][: round(size * len(fold))]


def held_out_log_probs(
    name: str, seed: int, sizes: tuple[float, ...] = SIZES
) -> tuple[np.ndarray, dict[float, np.ndarray], dict[float, np.ndarray]]:
    """Gold labels of the pool, per size the log-probabilities each row got from the model
    trained without its fold, and per size each ALSO query's share of fold models right on it."""
    setup = training.Setup(ROOT, training.Paths.for_model(ROOT, name))
    labels = setup.data.labels
    index = {lbl: i for i, lbl in enumerate(labels)}
    rows, feats = [], None
    for split in POOL:
        rows += read_jsonl(ROOT / "data" / "prepared" / f"{split}.jsonl")
        f = setup.split(split)
        feats = f if feats is None else concat(feats, f)
    negatives = setup.split("negatives") if setup.spec.head.out_of_scope_class else None
    y = np.array([index[r["label"]] for r in rows])

    def take(idx):
        return feats[torch.as_tensor(idx)] if torch.is_tensor(feats) else [feats[i] for i in idx]

    fold, order = plan(y, seed)
    out = {s: np.zeros((len(y), len(labels)), np.float32) for s in sizes}
    also_feats = setup.split(ALSO)
    also_y = np.array([index[r["label"]] for r in read_jsonl(ROOT / "data" / "prepared" / f"{ALSO}.jsonl")])
    also = {s: np.zeros(len(also_y)) for s in sizes}
    start = time.perf_counter()
    for k in range(FOLDS):
        held = np.flatnonzero(fold == k)
        for s in sizes:
            chosen = training_rows(fold, order, k, s)
            examples = [Example(rows[i]["text"], int(y[i])) for i in chosen]
            setup.feats = take(chosen)
            if negatives is not None:
                examples += [Example("", len(labels) - 1)] * len(negatives)
                setup.feats = concat(setup.feats, negatives)
            setup.data = TrainData(examples, labels, "learning-curve")
            setup.total_steps = steps_for(setup.spec, len(setup.feats))
            trainer = setup.trainer()
            trainer.fit(show_progress=False)
            logits = predict_logits(trainer.model, setup.featurizer, take(held), setup.device)
            out[s][held] = torch.log_softmax(logits.float(), -1).numpy()
            guess = predict_logits(trainer.model, setup.featurizer, also_feats, setup.device).argmax(-1)
            also[s] += (guess.numpy() == also_y) / FOLDS
        print(f"{name}: fold {k + 1}/{FOLDS} done ({time.perf_counter() - start:.0f} s)", flush=True)
    return y, out, also


def paired_gain(a: np.ndarray, b: np.ndarray, seed: int) -> tuple[float, float, float]:
    """Mean of b - a (per-row correctness) and its 95% bootstrap interval, in points."""
    d = b.astype(float) - a
    rng = np.random.default_rng(seed)
    boots = [d[rng.integers(0, len(d), len(d))].mean() for _ in range(2000)]
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return 100 * d.mean(), 100 * lo, 100 * hi


def extrapolate(sizes: np.ndarray, acc: np.ndarray, n: int) -> float:
    """Accuracy at the whole pool from acc = a - b * n^-c, least squares over c on a grid."""
    best = None
    for c in np.linspace(0.05, 2.0, 196):
        x = np.stack([np.ones_like(sizes), -(sizes**-c)], 1)
        coef, *_ = np.linalg.lstsq(x, acc, rcond=None)
        err = float(((x @ coef - acc) ** 2).sum())
        if best is None or err < best[0]:
            best = (err, coef[0] - coef[1] * n**-c)
    return float(best[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["ngram", "minilm_frozen"])
    ap.add_argument("--ensemble", default="ensemble", help="whose fitted weights combine the models")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    results = {m: held_out_log_probs(m, args.seed) for m in args.models}
    y = next(iter(results.values()))[0]
    fitted = ROOT / "metrics" / args.ensemble / "train.json"
    weights = json.loads(fitted.read_text()).get("weights", {}) if fitted.is_file() else {}
    w = {m: weights.get(m, 1.0) for m in args.models}
    print(f"\ncombination weights: {w} ({'fitted' if weights else 'equal'})")
    correct = {}
    for s in SIZES:
        combined = sum(w[m] * results[m][1][s] for m in args.models)
        correct[s] = {m: results[m][1][s].argmax(1) == y for m in args.models}
        correct[s]["combined"] = combined.argmax(1) == y
    n, rng = len(y), np.random.default_rng(args.seed)
    print(f"accuracy on {n} pooled queries, each predicted by a model that did not train on it")
    print("size of pool | rows | " + " | ".join(correct[SIZES[0]]))
    for s in SIZES:
        print(f"{s:.0%} | {round(s * n)} | " + " | ".join(f"{v.mean():.4f}" for v in correct[s].values()))
    print(f"\n{ALSO}: mean accuracy of the 10 fold models per size [95% bootstrap over its queries]")
    for s in SIZES:
        cells = []
        for m in args.models:
            right = results[m][2][s]
            boots = [right[rng.integers(0, len(right), len(right))].mean() for _ in range(2000)]
            lo, hi = np.percentile(boots, [2.5, 97.5])
            cells.append(f"{m} {right.mean():.3f} [{lo:.3f}, {hi:.3f}]")
        print(f"{s:.0%} | " + " | ".join(cells))
    for m in correct[SIZES[0]]:
        gain, lo, hi = paired_gain(correct[0.8][m], correct[0.9][m], args.seed)
        at_all = extrapolate(np.array(SIZES) * n, np.array([correct[s][m].mean() for s in SIZES]), n)
        print(
            f"{m}: 80% -> 90% {gain:+.2f} points [95% {lo:+.2f}, {hi:+.2f}]; "
            f"extrapolated to 100%: {at_all:.4f} "
            f"({100 * (at_all - correct[0.8][m].mean()):+.2f} points over 80%)"
        )


if __name__ == "__main__":
    main()
