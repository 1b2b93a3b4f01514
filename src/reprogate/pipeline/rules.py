"""The gate's rules as data: one row per rule, read the same way for every pipeline kind.

A row names the metric, the set it is read on (one split, or the worst of every set of a kind
the gate judges), the operator and the threshold's field in specs/gate.yaml. `judge` turns the
rows of a kind into verdicts; resume equivalence and the comparison with production follow,
the latter the one rule whose evidence differs by kind (pipeline/kinds.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from reprogate.records.production import RESTORE_PRODUCTION
from reprogate.specs.gate import GateSpec

Op = Literal[">=", "<=", "=="]


@dataclass(frozen=True)
class GateRule:
    name: str
    metric: str  # a field of an evaluation set in results/<m>/eval.json
    op: Op
    threshold: str  # a field of specs.gate.Thresholds; null there: the rule is n/a
    split: str | None = None  # read on this set ...
    worst_of: str | None = None  # ... or on the worst set of this kind the gate judges
    note: str = ""
    # When the data spec declares no set of worst_of's kind: a rule that does not apply, or,
    # for evidence a gate must not do without, a failed one.
    absent: Literal["n/a", "fail"] = "n/a"
    absent_note: str = ""
    detail: Callable[[dict], str] | None = None  # more words on the worst set


def verdict(name: str, value: Any, op: Op | None, threshold: Any, note: str = "") -> dict[str, Any]:
    if value is None:
        passed = False
        note = note or "metric missing"
    elif op == ">=":
        passed = value >= threshold
    elif op == "<=":
        passed = value <= threshold
    else:  # "==" on booleans
        passed = value == threshold
    out = {
        "rule": name,
        "value": value,
        "op": op,
        "threshold": threshold,
        "verdict": "pass" if passed else "fail",
    }
    return dict(out, note=note) if note else out


def not_applicable(name: str, note: str) -> dict[str, Any]:
    return {"rule": name, "value": None, "op": None, "threshold": None, "verdict": "n/a", "note": note}


def judged(sets: dict, kind: str) -> dict[str, dict]:
    """The sets of a kind the gate judges: those calibration and model choices never looked at."""
    # A language model's sets have no kind: none of them is of any kind.
    return {n: s for n, s in sets.items() if s.get("kind") == kind and s.get("use", "evaluate") == "evaluate"}


def apply(rule: GateRule, sets: dict, thresholds) -> dict[str, Any]:
    threshold = getattr(thresholds, rule.threshold)
    if threshold is None:
        return not_applicable(rule.name, f"no {rule.threshold} in the gate spec")
    if rule.split is not None:
        return verdict(rule.name, sets.get(rule.split, {}).get(rule.metric), rule.op, threshold, rule.note)
    of_kind = judged(sets, rule.worst_of)
    if not of_kind:
        if rule.absent == "n/a":
            return not_applicable(rule.name, rule.absent_note)
        return verdict(rule.name, None, rule.op, threshold, rule.absent_note)
    # The worst set decides: the lowest of a floor, the highest of a ceiling.
    pick = min if rule.op == ">=" else max
    worst = pick(of_kind, key=lambda n: of_kind[n][rule.metric])
    words = "lowest" if rule.op == ">=" else "highest"
    more = rule.detail(of_kind[worst]) if rule.detail else ""
    note = f"{words} of {sorted(of_kind)}: {worst}{more}"
    return verdict(rule.name, of_kind[worst][rule.metric], rule.op, threshold, note)


def challenge_kinds(sets: dict, limits: dict[str, float]) -> list[dict[str, Any]]:
    """One rule per kind of challenge query: its highest share acted on over the judged sets."""
    of_kind = judged(sets, "challenge")
    out = []
    for kind, limit in limits.items():
        name = f"challenge_action_rate[{kind}]"
        seen = {n: s["by_kind"][kind] for n, s in of_kind.items() if kind in s.get("by_kind", {})}
        if not seen:
            out.append(verdict(name, None, "<=", limit, f"no judged challenge set has {kind} queries"))
            continue
        worst = max(seen, key=lambda n: seen[n]["action_rate"])
        w = seen[worst]
        note = f"highest of {sorted(seen)}: {worst}, {w['acted']} of {w['n']} {kind} queries acted on"
        out.append(verdict(name, w["action_rate"], "<=", limit, note))
    return out


def resume_rule(resume: dict | None) -> dict[str, Any]:
    return verdict(
        "resume_equivalence",
        (resume or {}).get("passed"),
        "==",
        True,
        (resume or {}).get("unreadable") or ("" if resume else "results/<m>/resume.json missing"),
    )


def export_rule(export: dict, gate: GateSpec) -> dict[str, Any]:
    """An exported candidate predicts what its source predicts on the held-out test set."""
    threshold = gate.thresholds.export_agreement_min
    if threshold is None:
        return not_applicable("export_agreement", "no export_agreement_min in the gate spec")
    test = (export.get("agreement") or {}).get("test") or {}
    why = export.get("unreadable") or ("" if test else "no agreement on test in metrics/<m>/export.json")
    note = why or f"top intent equal to {export.get('source')}'s on {test['agree']} of {test['n']} test items"
    return verdict("export_agreement", test.get("share"), ">=", threshold, note)


ProductionRule = Callable[[dict, dict], dict[str, Any]]


def judge(
    rules: tuple[GateRule, ...],
    against_production: ProductionRule,
    ev: dict | None,
    resume: dict | None,
    gate: GateSpec,
    prod: dict | None,
) -> list[dict]:
    """Every verdict on one candidate, in the table's order, then resume equivalence (when the
    gate requires it) and the comparison with production (when enabled and there is one)."""
    sets = (ev or {}).get("sets", {})
    out = [apply(r, sets, gate.thresholds) for r in rules]
    out += challenge_kinds(sets, gate.thresholds.challenge_action_rate_max_by_kind)
    if gate.thresholds.require_resume_equivalence:
        out.append(resume_rule(resume))
    if not gate.compare_to_production.enabled:
        out.append(not_applicable("not_worse_than_production", "disabled in the gate spec"))
    elif prod is None:
        out.append(not_applicable("not_worse_than_production", "no model in production yet"))
    else:
        out.append(against_production(sets, prod))
    return out


def accuracy_against_production(sets: dict, prod: dict) -> dict[str, Any]:
    """A classifier is not worse when the upper end of its accuracy's 95% bootstrap interval
    reaches production's accuracy, both on the same held-out set."""
    test = sets.get("test", {})
    if not isinstance(prod.get("heldout_accuracy"), int | float):
        why = prod.get("unreadable") or "it has no heldout_accuracy"
        return verdict(
            "not_worse_than_production",
            None,
            ">=",
            None,
            f"models/production.json cannot be compared with: {why}; {RESTORE_PRODUCTION}",
        )
    hi = (test.get("accuracy_ci95") or [None, None])[1]
    rule = verdict(
        "not_worse_than_production",
        hi,
        ">=",
        prod["heldout_accuracy"],
        f"upper end of the candidate's 95% bootstrap interval vs production "
        f"{prod.get('model')} ({prod.get('model_version')})",
    )
    theirs, ours = prod.get("data_sha256", {}).get("test"), test.get("data_sha256")
    if theirs and ours and theirs != ours:
        # Accuracies on two different held-out sets say nothing about which model is better.
        rule.update(
            verdict="fail",
            note=f"production {prod['model']} was measured on another held-out set "
            f"(test sha256 {theirs[:12]}, candidates {ours[:12]}): the accuracies are not comparable. "
            "To move production to the new data on purpose, set compare_to_production.enabled: "
            "false in the gate spec for that promotion (its commit records it), then re-enable it.",
        )
    return rule


def bits_against_production(sets: dict, prod: dict) -> dict[str, Any]:
    """A language model is not worse when its validation bits per character are at most
    production's, on the same validation split."""
    val = sets.get("validation", {})
    ours, theirs = val.get("bits_per_char"), prod.get("val_bits_per_char")
    ours_sha, theirs_sha = val.get("data_sha256"), prod.get("data_sha256", {}).get("validation")
    if theirs is None or (ours_sha and theirs_sha and ours_sha != theirs_sha):
        return {
            "rule": "not_worse_than_production",
            "value": ours,
            "op": "<=",
            "threshold": theirs,
            "verdict": "fail",
            "note": f"production {prod.get('model')} has no bits per character on this validation split "
            "(another model kind, or another split): not comparable. To move production on purpose, set "
            "compare_to_production.enabled: false for that promotion, then re-enable it.",
        }
    who = f"production {prod.get('model')} ({prod.get('model_version')})"
    return verdict("not_worse_than_production", ours, "<=", theirs, who)
