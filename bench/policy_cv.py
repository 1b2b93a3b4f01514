"""How often does a routing policy fitted on ~1,000 calibration queries break the wrong-action
limit on new queries, for each `policy_fit.confidence`? Measured without the test set.

    make bench-policy      # or: python bench/policy_cv.py

On the same 10 folds as bench/learning_curve.py, every labelled non-test query (9,947) gets
log-probabilities from `ngram` and `minilm_frozen` trained on 80% of the pool without its fold
(the default's training size), and for the `ensemble_knn` combination a 30-nearest-neighbour
vote as bench/neighbours_cv.py builds it. Then each fold in turn plays the calibration
partition (about its size): the members' temperatures, the ensemble weights, the ensemble's
temperature and the routing policy are fitted on it with the product's own functions, and the
policy is applied to the other nine folds (about 8,950 queries), which stand for new data.
Reported per candidate and confidence: the coverage and wrong-action rate on those queries
(pooled over the 10 fits), and in how many of the 10 fits the rate on them is above the limit.

The false-positive limit is left out of the fit: the fold models do not predict the
out-of-scope calibration queries (oos_val), and on the real calibration data that limit does
not bind (calibration.json: none of its 100 queries acted on). Needs `make repro` first; about
10 minutes on 2 CPUs.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from learning_curve import FOLDS, ROOT, held_out_log_probs, plan
from neighbours_cv import SIZE, held_out_vote

from reprogate.predict.calibration import Policy, act_mask, fit_policy, fit_temperature, probabilities
from reprogate.predict.combine import fit_weights
from reprogate.specs.gate import GateSpec
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec

CONFIDENCES = (0.0, 0.8, 0.9, 0.95, 0.99)


def calibrated(members: list[np.ndarray], extra: list[np.ndarray], y: np.ndarray, fit: np.ndarray):
    """calibrate@member, combine@e and calibrate@e's temperature, all fitted on the rows `fit`:
    the ensemble's calibrated probabilities of every pooled query."""
    gold = torch.from_numpy(y[fit])
    parts = []
    for lp in members:
        t = fit_temperature(torch.from_numpy(lp[fit]), gold)
        parts.append(torch.log_softmax(torch.from_numpy(lp).double() / t, -1))
    parts += [torch.from_numpy(v).double() for v in extra]  # the vote has no temperature of its own
    stacked = torch.stack(parts, 1).float()
    model, _ = fit_weights(stacked[torch.from_numpy(fit)], gold, len(parts))
    with torch.no_grad():
        logits = model(stacked)
    t = fit_temperature(logits[torch.from_numpy(fit)], gold)
    return probabilities(logits, t), t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    gate = load_spec(ROOT / "specs" / "gate.yaml", GateSpec).thresholds
    knn = load_spec(ROOT / "specs" / "models" / "ensemble_knn.yaml", ModelSpec)
    y, ngram = held_out_log_probs("ngram", args.seed, (SIZE,))
    _, frozen = held_out_log_probs("minilm_frozen", args.seed, (SIZE,))
    members = [ngram[SIZE], frozen[SIZE]]
    n_out = members[0].shape[1]
    oos = (
        n_out - 1 if n_out == len(json.loads((ROOT / "data/prepared/labels.json").read_text())) + 1 else None
    )
    fold, order = plan(y, args.seed)
    candidates = {
        "ensemble": [],
        "ensemble_knn": [held_out_vote(knn.ensemble.neighbours, y, fold, order, n_out)],
    }
    empty = np.zeros((0, n_out))
    print(f"{len(y)} pooled queries; wrong-action limit {gate.wrong_action_rate_max}; each fit on one fold")
    print("candidate | confidence | coverage | wrong-action | fits above the limit")
    for name, extra in candidates.items():
        fits = [calibrated(members, extra, y, np.flatnonzero(fold == k)) for k in range(FOLDS)]
        for confidence in CONFIDENCES:
            acted = wrong = seen = above = 0
            for k, (probs, t) in enumerate(fits):
                fit, new = fold == k, fold != k
                p = fit_policy(
                    probs[fit],
                    y[fit],
                    empty,
                    oos,
                    gate.wrong_action_rate_max,
                    gate.false_positive_action_rate_max,
                    confidence,
                )
                act = act_mask(probs[new], Policy(t, p["threshold"], p["margin"]), oos)
                n_wrong = int((act & (probs[new].argmax(1) != y[new])).sum())
                acted, wrong, seen = acted + int(act.sum()), wrong + n_wrong, seen + int(new.sum())
                above += n_wrong > gate.wrong_action_rate_max * act.sum()
            print(
                f"{name} | {confidence} | {acted / seen:.3f} | {wrong / max(acted, 1):.4f} | "
                f"{above} of {FOLDS}",
                flush=True,
            )


if __name__ == "__main__":
    main()
