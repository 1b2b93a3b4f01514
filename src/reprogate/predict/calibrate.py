"""What stage `calibrate@m` runs: temperature and routing policy fitted on the calibration data
(pipeline/stages/calibrate.py declares it to DVC)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from reprogate.data.prepared import gold_indices, rows, texts
from reprogate.predict import requests
from reprogate.predict.calibration import (
    TEMPERATURE_RANGE,
    Policy,
    act_mask,
    ece,
    fit_policy,
    fit_temperature,
    probabilities,
    rows_to_certify,
    separable,
)
from reprogate.predict.scorers import open_scorer
from reprogate.records.base import write
from reprogate.records.calibration import CalibrationRecord
from reprogate.specs.data import DataSpec
from reprogate.specs.gate import GateSpec
from reprogate.specs.loader import load_spec


def calibrate(root: Path, name: str, gate_path: Path) -> dict[str, Any]:
    scorer = open_scorer(root, name)
    data = load_spec(root / scorer.spec.data, DataSpec)
    gate = load_spec(gate_path, GateSpec)
    gold = gold_indices(rows(root, "calibration"), scorer.labels)
    logits = scorer.split_logits("calibration")
    temperature = fit_temperature(logits, torch.from_numpy(gold))
    before, after = probabilities(logits), probabilities(logits, temperature)
    sets = data.prepared_sets().items()
    oos_sets = [n for n, (kind, use) in sets if kind == "out_of_scope" and use == "calibrate"]
    oos = [probabilities(scorer.split_logits(n), temperature) for n in oos_sets]
    oos_probs = np.concatenate(oos) if oos else np.zeros((0, len(scorer.labels)))
    limits = gate.thresholds
    policy = fit_policy(
        after,
        gold,
        oos_probs,
        scorer.oos_index,
        limits.wrong_action_rate_max,
        limits.false_positive_action_rate_max,
        gate.policy_fit.confidence,
    )
    rules = fit_request_rules(
        Policy(temperature, policy["threshold"], policy["margin"]),
        texts(root, "calibration"),
        after,
        scorer,
        gate,
    )
    nll = lambda p: float(-np.log(np.clip(p[np.arange(len(gold)), gold], 1e-12, None)).mean())  # noqa: E731
    result = {
        "temperature": temperature,
        "policy": {"threshold": policy["threshold"], "margin": policy["margin"], **rules.pop("levels")},
        "fitted_on": {
            "calibration_rows": len(gold),
            "out_of_scope_sets": oos_sets,
            "out_of_scope_rows": len(oos_probs),
        },
        "limits": {
            "wrong_action_rate_max": limits.wrong_action_rate_max,
            "false_positive_action_rate_max": limits.false_positive_action_rate_max,
            "bound_confidence": policy.pop("bound_confidence"),
        },
        "on_calibration_data": {
            "nll_before": nll(before),
            "nll_after": nll(after),
            "ece_before": ece(before, gold)[0],
            "ece_after": ece(after, gold)[0],
            **{k: v for k, v in policy.items() if k not in ("threshold", "margin")},
            "request_rules": rules,
        },
    }
    all_right = separable(logits, torch.from_numpy(gold))
    # Kept with the fit, so whoever reads the model's calibration (or promotes it) sees them too.
    result["warnings"] = warnings(result, gate.policy_fit.confidence, scorer.spec.data, all_right)
    write(scorer.dir / "calibration.json", CalibrationRecord.model_validate(result))
    return result


def fit_request_rules(
    policy: Policy, cal_texts: list[str], probs: np.ndarray, scorer, gate: GateSpec
) -> dict:
    """The request rules' levels (requests.py), each fitted so that it sends at most its budget of
    the calibration queries the policy would otherwise act on to review; and what each did there."""
    n, fit = len(cal_texts), gate.policy_fit
    asked = {k: getattr(fit, f"{k}_max") for k in requests.RULES}
    # A budget these rows cannot hold leaves its rule off (warnings() says so) rather than fitted.
    too_few = {k: b for k, b in asked.items() if b is not None and n < requests.rows_needed(b)}
    budgets = {k: None if k in too_few else b for k, b in asked.items()}
    acted = act_mask(probs, policy, scorer.oos_index)
    # Scored once: the fit and the fitted policy's reasons read the same strengths.
    strength = policy.two_request_strength(cal_texts, scorer) if budgets["two_requests"] is not None else None
    spread = requests.spread(probs) * acted
    levels = {
        "two_requests": requests.fit_level(
            strength * acted if strength is not None else np.zeros(n), n, budgets["two_requests"]
        ),
        "ambiguous": requests.fit_level(spread, n, budgets["ambiguous"]),
        "too_short": requests.fit_words(requests.words(cal_texts), acted, budgets["too_short"]),
    }
    held = Policy(policy.temperature, policy.threshold, policy.margin, **levels)
    extra = held.request_reasons(cal_texts, probs, scorer, strength)
    sent = {k: sum(bool(acted[i]) and k in r for i, r in enumerate(extra)) for k in levels}
    return {
        "levels": levels,
        "sent_to_review": {k: v / n for k, v in sent.items()},
        "coverage_after": float(act_mask(probs, held, scorer.oos_index, extra).mean()),
        "with_clauses": sum(bool(requests.clauses(t)) for t in cal_texts) / n,
        **({"off_too_few_rows": too_few} if too_few else {}),
    }


def warnings(r: dict[str, Any], confidence: float, data_spec: str, all_right: bool) -> list[str]:
    """What a fit on this data cannot promise. Said on every run, because a limit held only on a
    small sample is an estimate, not a guarantee, and a temperature at its bound is no estimate."""
    out = []
    t, n = r["temperature"], r["fitted_on"]["calibration_rows"]
    if all_right:
        out.append(
            f"the model got all {n} calibration queries right, so they cannot say how confident it "
            "should be: the temperature stays 1.0 (no scaling), and a probability near 1 is not "
            f"evidence; add calibration data (split.calibration in {data_spec})"
        )
    elif t <= TEMPERATURE_RANGE[0] or t >= TEMPERATURE_RANGE[1]:
        low = t <= TEMPERATURE_RANGE[0]
        out.append(
            f"the temperature stopped at its bound {t:g}: the {n} calibration queries cannot tell how "
            + (
                "far to sharpen this model (it got almost all of them right by wide margins), so its "
                "probabilities will be overconfident on new queries"
                if low
                else "far to soften this model, so its probabilities will be underconfident"
            )
            + f"; add calibration data (split.calibration in {data_spec})"
        )
    bounded, n_oos = r["limits"]["bound_confidence"], r["fitted_on"]["out_of_scope_rows"]
    if confidence > 0 and bounded["wrong_action_rate"] == 0:
        need = rows_to_certify(r["limits"]["wrong_action_rate_max"], confidence)
        out.append(
            f"the wrong-action limit holds for the rate seen on {n} calibration queries, too few for a "
            f"{confidence:.0%} confidence bound (at least {need} are needed: raise split.calibration in "
            f"{data_spec})"
        )
    if n_oos == 0:
        out.append("no out-of-scope set has use: calibrate, so the false-positive limit was not fitted")
    elif confidence > 0 and bounded["false_positive_action_rate"] == 0:
        out.append(
            f"the false-positive limit holds for the rate seen on {n_oos} out-of-scope queries, too few "
            "for a confidence bound (add out-of-scope queries with use: calibrate to get one)"
        )
    out.extend(request_rule_warnings(r, data_spec))
    return out


def request_rule_warnings(r: dict[str, Any], data_spec: str) -> list[str]:
    n = r["fitted_on"]["calibration_rows"]
    rules = r.get("on_calibration_data", {}).get("request_rules") or {}  # none before the rules
    off = rules.get("off_too_few_rows", {})
    out = []
    for name, budget in off.items():
        need = requests.rows_needed(budget)
        out.append(
            f"the {name} rule is off: a budget of 0 (policy_fit.{name}_max) cannot be kept on any "
            "calibration data; set it to null to say the rule is off, or give it a share"
            if need == float("inf")
            else f"the {name} rule is off: {n} calibration queries cannot keep its budget of "
            f"{budget:.3g} (policy_fit.{name}_max; at least {need} are needed): raise "
            f"split.calibration in {data_spec} or the budget in the gate spec"
        )
    return out


def summary(name: str, r: dict[str, Any]) -> str:
    c = r["on_calibration_data"]
    line = (
        f"calibrate: {name}: temperature {r['temperature']:.3f}, ECE {c['ece_before']:.4f} -> "
        # .6g: a threshold of 0.99986 printed as 1.000 would read as "never acts".
        f"{c['ece_after']:.4f}; act when p >= {r['policy']['threshold']:.6g} and margin >= "
        f"{r['policy']['margin']:.6g} (coverage {c['coverage']:.3f} on calibration data)"
    )
    p, rules = r["policy"], c.get("request_rules")
    if rules:
        said = [
            *([f"two requests at p >= {p['two_requests']:.3g}"] if p.get("two_requests") is not None else []),
            *([f"ambiguous at spread >= {p['ambiguous']:.3g}"] if p.get("ambiguous") is not None else []),
            *([f"too short at <= {p['too_short']} words"] if p.get("too_short") else []),
        ]
        if said:
            line += f"; to review: {', '.join(said)} (coverage {rules['coverage_after']:.3f})"
    return "; ".join([line, *r.get("warnings", [])])
