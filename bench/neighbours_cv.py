"""Is a nearest-neighbour vote worth adding to the ensemble, and with which k and temperature?

    make bench-neighbours      # or: python bench/neighbours_cv.py

Measured without the test set, on the same 10 folds as bench/learning_curve.py: every
labelled non-test query (9,947) is predicted by `ngram` and `minilm_frozen` trained on 80% of
the pool without its fold (the default's training size), and by a vote of its k nearest
neighbours (cosine, over `minilm_frozen`'s cached embeddings) among the same training rows plus
the negatives, labelled out of scope, as ensemble_knn's memory holds them. The combination's
weights are fitted as combine@e fits them (NLL, on one fold, about the calibration partition's
size) and applied to the next fold, so no weight is fitted on the queries it is scored on.
Reported per (k, temperature): accuracy over the pool, and the paired gain over the members
alone with its 95% bootstrap interval. Needs `make repro` first; about 10 minutes on 2 CPUs.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from learning_curve import FOLDS, POOL, ROOT, held_out_log_probs, paired_gain, plan, training_rows
from safetensors.torch import load_file

from reprogate.models.ensemble import Neighbours
from reprogate.predict.combine import fit_weights
from reprogate.specs.families.ensemble import NeighboursConfig

SIZE = 0.8
GRID = [(k, t) for k in (10, 30, 50) for t in (0.02, 0.03, 0.05)]


def embeddings(member: str, split: str) -> torch.Tensor:
    return load_file(str(ROOT / "data" / "features" / member / f"{split}.safetensors"))["embedding"]


def held_out_vote(
    config: NeighboursConfig, y: np.ndarray, fold: np.ndarray, order: np.ndarray, n_out: int
) -> np.ndarray:
    """Every pooled query's neighbour vote, its memory the rows its fold's members trained on,
    plus the negatives under out of scope when the members have that class (as ensemble_knn's)."""
    pool = torch.cat([embeddings(config.member, s) for s in POOL])  # the rows of `y`, in order
    oos = len(json.loads((ROOT / "data" / "prepared" / "labels.json").read_text()))
    negatives = embeddings(config.member, "negatives") if n_out == oos + 1 else pool[:0]
    vote = np.zeros((len(y), n_out), np.float32)
    for k in range(FOLDS):
        rows = training_rows(fold, order, k, SIZE)
        memory = torch.cat([pool[torch.as_tensor(rows)], negatives])
        gold = torch.cat([torch.from_numpy(y[rows]), torch.full((len(negatives),), oos)])
        held = np.flatnonzero(fold == k)
        near = Neighbours.from_features(config, memory, gold, n_out)
        vote[held] = near.log_probs(pool[torch.as_tensor(held)]).numpy()
    return vote


def nested(parts: list[np.ndarray], y: np.ndarray, fold: np.ndarray) -> np.ndarray:
    """Per row, whether the combination is right, with weights fitted on the next fold."""
    logp = torch.from_numpy(np.stack(parts, 1))
    right = np.zeros(len(y), bool)
    for k in range(FOLDS):
        fit, score = fold == (k + 1) % FOLDS, fold == k
        model, _ = fit_weights(logp[fit], torch.from_numpy(y[fit]), len(parts))
        with torch.no_grad():
            right[score] = model(logp[score]).argmax(1).numpy() == y[score]
    return right


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--member", default="minilm_frozen", help="whose embeddings the vote searches")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    y, ngram = held_out_log_probs("ngram", args.seed, (SIZE,))
    _, frozen = held_out_log_probs(args.member, args.seed, (SIZE,))
    members = [ngram[SIZE], frozen[SIZE]]
    n_out = members[0].shape[1]
    fold, order = plan(y, args.seed)
    base = nested(members, y, fold)
    print(f"members alone ({len(y)} pooled queries, weights fitted on the next fold): {base.mean():.4f}")
    print("k | temperature | with the vote | gain over members [95%]")
    for k_nn, temperature in GRID:
        config = NeighboursConfig(member=args.member, k=k_nn, temperature=temperature)
        vote = held_out_vote(config, y, fold, order, n_out)
        right = nested([*members, vote], y, fold)
        gain, lo, hi = paired_gain(base, right, args.seed)
        print(f"{k_nn} | {temperature} | {right.mean():.4f} | {gain:+.2f} points [{lo:+.2f}, {hi:+.2f}]")


if __name__ == "__main__":
    main()
