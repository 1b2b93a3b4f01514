"""Calibration and routing: the numbers that decide whether the house acts.

Temperature scaling fitted on the calibration partition, the routing policy (a confidence
threshold and a top-1/top-2 margin) with its rate bounds, expected calibration error, and the
Prediction object every consumer sees. calibrate, evaluate, predict and serve all use these
functions, so the route evaluation counts is the route a user is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.special import betaincinv

from reprogate.folder.files import read_calibration
from reprogate.predict import requests
from reprogate.records.calibration import CalibrationRecord

N_BINS = 15


@dataclass
class Policy:
    temperature: float
    threshold: float  # act only when the calibrated top-1 probability is at least this
    margin: float  # ... and top-1 minus top-2 is at least this
    two_requests: float | None = None  # predict/requests.py's rules; None: off
    ambiguous: float | None = None
    too_short: int | None = None

    @classmethod
    def of(cls, c: CalibrationRecord) -> Policy:
        p = c.policy
        return cls(c.temperature, p.threshold, p.margin, p.two_requests, p.ambiguous, p.too_short)

    def levels(self) -> dict[str, float | int | None]:
        return {k: getattr(self, k) for k in requests.RULES}

    def two_request_strength(self, texts: list[str], scorer) -> np.ndarray:
        """requests.two_request_strength, the clauses scored by `scorer` (anything with
        text_logits and oos_index) under this policy's temperature."""
        score = lambda parts: probabilities(scorer.text_logits(parts), self.temperature)  # noqa: E731
        return requests.two_request_strength(texts, score, scorer.oos_index)

    def request_reasons(
        self, texts: list[str], probs: np.ndarray, scorer, strength: np.ndarray | None = None
    ) -> list[list[str]]:
        """Each query's reasons for review from the request rules (requests.py); `strength`:
        this policy's two_request_strength of the texts when the caller has it already."""
        if not any(self.levels().values()):
            return [[] for _ in texts]
        if strength is None and self.two_requests is not None:
            strength = self.two_request_strength(texts, scorer)
        return requests.reasons(texts, probs, self.levels(), strength)

    @classmethod
    def load(cls, path: Path) -> Policy:
        return cls.of(read_calibration(path))


def separable(logits: torch.Tensor, gold: torch.Tensor) -> bool:
    """Whether the top score is the gold label's on every row."""
    return bool((logits.argmax(1) == gold).all())


# Beyond these a temperature is no longer an estimate: the calibration data cannot pin it down.
TEMPERATURE_RANGE = (0.05, 20.0)


def fit_temperature(logits: torch.Tensor, gold: torch.Tensor) -> float:
    """Temperature that minimises the NLL of the calibration partition (LBFGS on log T).

    When the model gets every row right, the NLL keeps falling as T shrinks towards 0: there
    is no minimum, only wherever the optimiser stalls. Then 1.0 (the model's own
    probabilities) is kept, and calibrate says why."""
    if separable(logits, gold):
        return 1.0
    log_t = torch.zeros(1, requires_grad=True, dtype=torch.float64)
    x, y = logits.double(), gold
    opt = torch.optim.LBFGS([log_t], lr=0.1, max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x / log_t.exp(), y)
        loss.backward()
        return loss

    opt.step(closure)
    return float(log_t.detach().exp().clamp(*TEMPERATURE_RANGE))


def probabilities(logits: torch.Tensor, temperature: float = 1.0) -> np.ndarray:
    return torch.softmax(logits.double() / temperature, dim=-1).numpy()


def confidence_margin(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    top2 = np.sort(probs, axis=1)[:, -2:]
    return probs.argmax(1), top2[:, 1], top2[:, 1] - top2[:, 0]


def act_mask(
    probs: np.ndarray, policy: Policy, oos_index: int | None, extra: list[list[str]] | None = None
) -> np.ndarray:
    """Which queries are acted on; `extra`: each one's reasons from the request rules."""
    pred, conf, margin = confidence_margin(probs)
    act = (conf >= policy.threshold) & (margin >= policy.margin)
    if extra is not None:
        act &= np.array([not r for r in extra], dtype=bool)
    if oos_index is not None:
        act &= pred != oos_index
    return act


def upper_bound(errors: int, n: int, confidence: float) -> float:
    """One-sided Clopper-Pearson upper bound of a rate seen as errors/n (the point estimate
    when confidence is 0)."""
    if n == 0:
        return 0.0
    if confidence == 0 or errors >= n:
        return errors / n
    # The Beta(errors + 1, n - errors) quantile: scipy.stats.beta.ppf's value, without importing
    # scipy.stats (a second per stage process).
    return float(betaincinv(errors + 1, n - errors, confidence))


def certifiable(n: int, limit: float, confidence: float) -> bool:
    """Whether n queries can show a rate below `limit` at `confidence` at all (zero errors)."""
    return confidence > 0 and upper_bound(0, n, confidence) <= limit


def rows_to_certify(limit: float, confidence: float) -> int:
    """The fewest queries that can show a rate below `limit` at `confidence` (zero errors)."""
    return math.ceil(math.log(1 - confidence) / math.log(1 - limit))


def fit_policy(
    cal_probs: np.ndarray,
    cal_gold: np.ndarray,
    oos_probs: np.ndarray,
    oos_index: int | None,
    wrong_max: float,
    fp_max: float,
    confidence: float = 0.0,
) -> dict[str, Any]:
    """The (threshold, margin) with the most coverage on the calibration partition whose
    wrong-action rate there and false-positive action rate on the out-of-scope queries meet
    the gate's limits. Ties go to the stricter policy.

    With `confidence` > 0 a limit must hold for the one-sided Clopper-Pearson upper bound of
    the rate, not just the rate seen: the best of many candidate policies is chosen exactly
    where its sampled rate dips below the limit, so the seen rate flatters it on new data.
    A set too small to show the limit even with zero errors (100 out-of-scope queries cannot
    show 1% at 90%) is held to its point estimate instead, and the result says so."""
    pred, conf, margin = confidence_margin(cal_probs)
    correct = pred == cal_gold
    _, oconf, omargin = confidence_margin(oos_probs) if len(oos_probs) else (None, np.zeros(0), np.zeros(0))
    opred = oos_probs.argmax(1) if len(oos_probs) else np.zeros(0, dtype=int)
    in_ok = np.ones_like(correct) if oos_index is None else pred != oos_index
    out_ok = np.ones(len(oconf), bool) if oos_index is None else opred != oos_index
    wrong_conf = confidence if certifiable(len(conf), wrong_max, confidence) else 0.0
    fp_conf = confidence if certifiable(len(oconf), fp_max, confidence) else 0.0
    thresholds = np.unique(np.concatenate([np.round(np.linspace(0, 1, 201), 4), conf, oconf]))
    best = None
    for m in np.round(np.linspace(0.0, 0.5, 26), 4):
        for t in thresholds:
            act = (conf >= t) & (margin >= m) & in_ok
            n_act, n_wrong = int(act.sum()), int((act & ~correct).sum())
            n_fp = int(((oconf >= t) & (omargin >= m) & out_ok).sum())
            if n_wrong > wrong_max * n_act or n_fp > fp_max * len(oconf):
                continue  # the seen rate already breaks a limit; its bound can only be higher
            wrong_bound = upper_bound(n_wrong, n_act, wrong_conf)
            fp_bound = upper_bound(n_fp, len(oconf), fp_conf)
            if wrong_bound <= wrong_max and fp_bound <= fp_max:
                cov = n_act / len(conf)
                if best is None or cov > best["coverage"] + 1e-12:
                    best = {
                        "threshold": float(t),
                        "margin": float(m),
                        "coverage": cov,
                        "wrong_action_rate": n_wrong / n_act if n_act else 0.0,
                        "wrong_action_rate_bound": wrong_bound,
                        "false_positive_action_rate": n_fp / len(oconf) if len(oconf) else 0.0,
                        "false_positive_action_rate_bound": fp_bound,
                    }
                break  # higher thresholds at this margin only lose coverage
    if best is None:
        best = {
            "threshold": 1.01,
            "margin": 1.0,
            "coverage": 0.0,
            "wrong_action_rate": 0.0,
            "false_positive_action_rate": 0.0,
            "note": "no policy meets the limits: nothing is acted on",
        }
    best["bound_confidence"] = {"wrong_action_rate": wrong_conf, "false_positive_action_rate": fp_conf}
    return best


def ece(probs: np.ndarray, gold: np.ndarray, bins: int = N_BINS) -> tuple[float, list[dict]]:
    """Expected calibration error with equal-width confidence bins, and the diagram data."""
    pred, conf, _ = confidence_margin(probs)
    correct = pred == gold
    edges = np.linspace(0, 1, bins + 1)
    idx = np.clip(np.digitize(conf, edges[1:-1], right=True), 0, bins - 1)
    total, rows = 0.0, []
    for b in range(bins):
        m = idx == b
        if m.any():
            gap = abs(conf[m].mean() - correct[m].mean())
            total += m.mean() * gap
            rows.append(
                {
                    "bin": b,
                    "lower": float(edges[b]),
                    "upper": float(edges[b + 1]),
                    "confidence": float(conf[m].mean()),
                    "accuracy": float(correct[m].mean()),
                    "count": int(m.sum()),
                }
            )
    return float(total), rows


def prediction(
    probs_row: np.ndarray, labels: list[str], policy: Policy, oos_index: int | None, extra: list[str] = ()
) -> dict[str, Any]:
    """The Prediction object of docs/design.md (without model version and latency, added by callers)."""
    # Stable, so a tie goes to the first label as in argmax: the served route must be the one
    # act_mask evaluated (a tie with the out-of-scope class would otherwise flip it).
    order = np.argsort(-probs_row, kind="stable")
    top = [{"intent": labels[i], "probability": round(float(probs_row[i]), 6)} for i in order[:3]]
    conf = float(probs_row[order[0]])
    margin = conf - float(probs_row[order[1]]) if len(order) > 1 else conf
    reasons = []
    if oos_index is not None and order[0] == oos_index:
        reasons.append("out_of_scope")
    if conf < policy.threshold:
        reasons.append("low_confidence")
    if margin < policy.margin:
        reasons.append("small_margin")
    reasons += extra  # two_requests, ambiguous
    return {
        "intent": labels[order[0]],
        "probability": round(conf, 6),
        "alternatives": top,
        "route": "review" if reasons else "act",
        "reasons": reasons,
    }
