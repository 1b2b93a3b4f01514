"""Stage `gate`: every candidate against specs/gate.yaml and the production model.

Reads metrics/<m>/eval.json and metrics/<m>/resume.json of every model in params.yaml and
models/production.json, and writes metrics/gate.json: per candidate, per rule, the value,
the threshold and the verdict; then the chosen candidate (the best held-out accuracy among
those passing every rule) or none, with reasons. A failed gate is a recorded decision: the
stage succeeds and promotion refuses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reprogate.errors import UserError, first_problem
from reprogate.pipeline import PRODUCTION, RESTORE_PRODUCTION
from reprogate.specs import GateSpec, ModelSpec, load_spec


def _rule(name: str, value: Any, op: str, threshold: Any, note: str = "") -> dict[str, Any]:
    if value is None:
        verdict = "fail"
        note = note or "metric missing"
    elif op == ">=":
        verdict = "pass" if value >= threshold else "fail"
    elif op == "<=":
        verdict = "pass" if value <= threshold else "fail"
    else:  # "==" on booleans
        verdict = "pass" if value == threshold else "fail"
    out = {"rule": name, "value": value, "op": op, "threshold": threshold, "verdict": verdict}
    return dict(out, note=note) if note else out


def _na(name: str, note: str) -> dict[str, Any]:
    return {"rule": name, "value": None, "op": None, "threshold": None, "verdict": "n/a", "note": note}


# The fields of the evidence the gate reads, with their types: a file that parses but has the
# wrong shape (a hand edit, a file from another tool) is recorded as unreadable, never a crash.
# A metric that is merely absent stays a failed rule ("metric missing") of its own.
class _Evidence(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class _Labelled(_Evidence):
    kind: Literal["labelled"]
    accuracy: float
    accuracy_ci95: tuple[float, float] | None = None
    ece_after: float | None = None
    wrong_action_rate: float | None = None
    coverage: float | None = None
    data_sha256: str | None = None


class _OutOfScope(_Evidence):
    kind: Literal["out_of_scope"]
    false_positive_action_rate: float


class _Evaluation(_Evidence):
    model_version: str | None = None
    sets: dict[str, Annotated[_Labelled | _OutOfScope, Field(discriminator="kind")]] = {}


class _Resume(_Evidence):
    passed: bool | None = None


class _Production(_Evidence):
    model: str | None = None
    model_version: str | None = None
    heldout_accuracy: float | None = None
    data_sha256: dict[str, str] = {}


class _Rule(_Evidence):
    rule: str
    value: Any
    op: str | None
    threshold: Any
    verdict: Literal["pass", "fail", "n/a"]


class _Candidate(_Evidence):
    passed: bool
    heldout_accuracy: float | None
    model_version: str | None
    rules: list[_Rule]


class Decision(_Evidence):
    """What `run` writes to metrics/gate.json, as promote reads it."""

    passed: bool
    chosen: str | None
    reasons: list[str]
    candidates: dict[str, _Candidate]


def read_decision(root: Path, fix: str) -> dict[str, Any]:
    """metrics/gate.json, or one paragraph naming the file, what is wrong with it and `fix`."""
    path = root / "metrics" / "gate.json"
    if not path.is_file():
        raise UserError(f"{path} does not exist: run `dvc repro` (the gate stage) first.")
    decision = _read(path, Decision)
    assert decision is not None
    if (
        "unreadable" not in decision
        and decision["passed"]
        and decision["chosen"] not in decision["candidates"]
    ):
        decision = {
            "unreadable": f"gate.json chose {decision['chosen']!r}, which is not among its candidates"
        }
    if "unreadable" in decision:
        raise UserError(f"{path}: {decision['unreadable']}; it is not the gate's record as written. {fix}")
    return decision


def _read(path: Path, shape: type[_Evidence]) -> dict[str, Any] | None:
    """A JSON file of evidence; None when absent. A damaged one (truncated, a merge conflict,
    a field of the wrong type) comes back as {"unreadable": why}: the gate records it as
    missing evidence, never crashes."""
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
        shape.model_validate_json(text)
    except UnicodeDecodeError as e:
        return {"unreadable": f"{path.name} is not valid JSON ({e})"}
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        if first["type"] == "json_invalid":
            return {"unreadable": f"{path.name} is not valid JSON ({first['ctx']['error']})"}
        if first["type"] == "model_type":
            return {"unreadable": f"{path.name} is not a JSON object"}
        # Drop the tags pydantic adds for the set kinds: the user sees sets.test.accuracy.
        field, found = first_problem(e, skip=("labelled", "out_of_scope"))
        return {"unreadable": f"{path.name} does not have the fields reprogate writes ({field}: {found})"}
    return json.loads(text)


def production(root: Path) -> dict[str, Any] | None:
    prod = _read(root / PRODUCTION, _Production)
    return prod if prod and (prod.get("model") or "unreadable" in prod) else None


def judge(name: str, ev: dict | None, resume: dict | None, gate: GateSpec, prod: dict | None) -> list[dict]:
    t = gate.thresholds
    sets = (ev or {}).get("sets", {})
    test = sets.get("test", {})
    rules = [
        _rule("heldout_accuracy", test.get("accuracy"), ">=", t.heldout_accuracy_min),
        _rule("ece", test.get("ece_after"), "<=", t.ece_max, "after calibration, 15 equal-width bins"),
        _rule("wrong_action_rate", test.get("wrong_action_rate"), "<=", t.wrong_action_rate_max),
        _rule("coverage", test.get("coverage"), ">=", t.coverage_min, "in-scope test queries acted on")
        if t.coverage_min is not None
        else _na("coverage", "no coverage_min in the gate spec"),
    ]
    real = {n: s for n, s in sets.items() if s["kind"] == "labelled" and n not in ("test", "validation")}
    if real:
        worst = min(real, key=lambda n: real[n]["accuracy"])
        rules.append(
            _rule(
                "real_utterance_accuracy",
                real[worst]["accuracy"],
                ">=",
                t.real_utterance_accuracy_min,
                f"lowest of {sorted(real)}: {worst}",
            )
        )
    else:
        rules.append(_na("real_utterance_accuracy", "the data spec declares no real-utterance set"))
    oos = {n: s for n, s in sets.items() if s["kind"] == "out_of_scope"}
    if oos:
        worst = max(oos, key=lambda n: oos[n]["false_positive_action_rate"])
        rules.append(
            _rule(
                "false_positive_action_rate",
                oos[worst]["false_positive_action_rate"],
                "<=",
                t.false_positive_action_rate_max,
                f"highest of {sorted(oos)}: {worst}",
            )
        )
    else:
        rules.append(
            _rule(
                "false_positive_action_rate",
                None,
                "<=",
                t.false_positive_action_rate_max,
                "the data spec declares no out-of-scope evaluation set",
            )
        )
    if t.require_resume_equivalence:
        rules.append(
            _rule(
                "resume_equivalence",
                (resume or {}).get("passed"),
                "==",
                True,
                (resume or {}).get("unreadable") or ("" if resume else "metrics/<m>/resume.json missing"),
            )
        )
    c = gate.compare_to_production
    if not c.enabled:
        rules.append(_na("not_worse_than_production", "disabled in the gate spec"))
    elif prod is None:
        rules.append(_na("not_worse_than_production", "no model in production yet"))
    elif not isinstance(prod.get("heldout_accuracy"), int | float):
        why = prod.get("unreadable") or "it has no heldout_accuracy"
        rules.append(
            _rule(
                "not_worse_than_production",
                None,
                ">=",
                None,
                f"models/production.json cannot be compared with: {why}; {RESTORE_PRODUCTION}",
            )
        )
    else:
        hi = (test.get("accuracy_ci95") or [None, None])[1]
        rule = _rule(
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
        rules.append(rule)
    return rules


def resume_evidence(root: Path, name: str) -> dict[str, Any] | None:
    """resume.json of a trained model; for an ensemble, every member's must have passed."""
    spec_path = root / "specs" / "models" / f"{name}.yaml"
    try:
        spec = load_spec(spec_path, ModelSpec) if spec_path.is_file() else None
    except UserError as e:
        # Edited since its stages ran: which members' evidence counts is unknown, so the rule
        # fails and says why, and the other candidates are still judged.
        why = f"specs/models/{name}.yaml no longer validates, so its resume evidence cannot be found: {e}"
        return {"unreadable": why}
    if spec is None or spec.family != "ensemble":
        return _read(root / "metrics" / name / "resume.json", _Resume)
    members = {m: _read(root / "metrics" / m / "resume.json", _Resume) for m in spec.ensemble.members}
    return {"passed": all(r is not None and r.get("passed") for r in members.values()), "members": members}


def run(root: Path, models: list[str], gate_path: Path) -> dict[str, Any]:
    gate = load_spec(gate_path, GateSpec)
    prod = production(root)
    candidates = {}
    for name in models:
        ev = _read(root / "metrics" / name / "eval.json", _Evaluation)
        unreadable = (ev or {}).get("unreadable")
        ev = None if unreadable else ev
        rules = judge(name, ev, resume_evidence(root, name), gate, prod)
        candidates[name] = {
            **({} if ev else {"not_evaluated": unreadable or True}),
            "passed": all(r["verdict"] != "fail" for r in rules),
            "heldout_accuracy": (ev or {}).get("sets", {}).get("test", {}).get("accuracy"),
            "model_version": (ev or {}).get("model_version"),
            "rules": rules,
        }
    passing = sorted(
        (n for n, c in candidates.items() if c["passed"]), key=lambda n: -candidates[n]["heldout_accuracy"]
    )
    reasons = []
    for n, c in candidates.items():
        failed = [r["rule"] for r in c["rules"] if r["verdict"] == "fail"]
        if isinstance(c.get("not_evaluated"), str):
            reasons.append(
                f"{n}: not evaluated (metrics/{n}/{c['not_evaluated']}; run "
                f"`dvc repro --force --single-item evaluate@{n}`, then `dvc repro`)"
            )
            continue
        if c.get("not_evaluated"):
            # Typically a model added to params.yaml after dvc.yaml was last compiled.
            reasons.append(
                f"{n}: not evaluated (no metrics/{n}/eval.json; after adding a model to params.yaml, "
                "run `reprogate compile`, then `dvc repro`)"
            )
            continue
        reasons.append(f"{n}: " + ("passed every rule" if not failed else f"failed {', '.join(failed)}"))
    if passing and len(passing) > 1:
        reasons.append(f"{passing[0]} has the best held-out accuracy among passing candidates")
    result = {
        "passed": bool(passing),
        "chosen": passing[0] if passing else None,
        "reasons": reasons,
        "production": {k: prod.get(k) for k in ("model", "model_version", "heldout_accuracy")}
        if prod
        else None,
        "gate_spec": str(gate_path.relative_to(root)) if gate_path.is_relative_to(root) else str(gate_path),
        "candidates": candidates,
    }
    (root / "metrics").mkdir(exist_ok=True)
    (root / "metrics" / "gate.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return result


def summary(r: dict[str, Any]) -> str:
    if r["passed"]:
        return f"gate: PASSED: {r['chosen']} may be promoted ({'; '.join(r['reasons'])})"
    return f"gate: no candidate passed ({'; '.join(r['reasons'])}); production stays as it is"
