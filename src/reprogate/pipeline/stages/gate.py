"""Stage `gate`: every candidate against specs/gate.yaml and the production model.

Reads results/<m>/eval.json and results/<m>/resume.json of every model in params.yaml and
models/production.json, and writes results/gate.json: per candidate, per rule, the value,
the threshold and the verdict; then the chosen candidate (the best held-out accuracy among
those passing every rule) or none, with reasons. Its headline, metrics/gate.json, holds the
verdicts. A failed gate is a recorded decision: the
stage succeeds and promotion refuses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reprogate.pipeline.context import Context, Result
from reprogate.records import (
    RESTORE_PRODUCTION,
    Decision,
    Evaluation,
    ProductionRecord,
    Record,
    ResumeRecord,
    parse,
    write,
)
from reprogate.records.headline import GateMetrics
from reprogate.records.lm import LmEvaluation
from reprogate.specs import GateSpec, ModelSpec, Pipeline, load_pipeline, load_spec
from reprogate.utils import paths
from reprogate.utils.errors import UserError

PER_MODEL = None


def dvc(p: Pipeline) -> dict[str, Any]:
    evidence = [f"results/{m}/eval.json" for m in p.models]
    evidence += [f"results/{m}/resume.json" for m, spec in p.models.items() if spec.family != "ensemble"]
    return {
        "deps": [*evidence, "models/production.json"],
        "params": [{p.gate: None}, {"params.yaml": ["models"]}],
        "outs": [{"results/gate.json": {"cache": False}}],
        "metrics": [{"metrics/gate.json": {"cache": False}}],
    }


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


def _read(path: Path, shape: type[Record]) -> dict[str, Any] | None:
    """A JSON file of evidence as a dict; None when absent. A damaged one (truncated, a merge
    conflict, a field of the wrong type) comes back as {"unreadable": why}: the gate records it
    as missing evidence, never crashes. A metric that is merely absent stays a failed rule
    ("metric missing") of its own."""
    record, why = parse(path, shape)
    if why:
        return {"unreadable": why}
    return record.model_dump(mode="json", exclude_unset=True) if record else None


def production(root: Path) -> dict[str, Any] | None:
    prod = _read(root / paths.PRODUCTION, ProductionRecord)
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
        _real_utterances(sets, t.real_utterance_accuracy_min),
        _false_positives(sets, t.false_positive_action_rate_max),
        _challenge(sets, t.challenge_action_rate_max),
    ]
    if t.require_resume_equivalence:
        rules.append(_resume_rule(resume))
    rules.append(_against_production(test, gate, prod))
    return rules


def _judged(sets: dict, kind: str) -> dict[str, dict]:
    """The sets of a kind the gate judges: those calibration and model choices never looked at."""
    return {n: s for n, s in sets.items() if s["kind"] == kind and s.get("use", "evaluate") == "evaluate"}


def _real_utterances(sets: dict, minimum: float) -> dict[str, Any]:
    real = _judged(sets, "real_utterance")
    if not real:
        return _na("real_utterance_accuracy", "the data spec declares no real-utterance set to evaluate")
    worst = min(real, key=lambda n: real[n]["accuracy"])
    return _rule(
        "real_utterance_accuracy",
        real[worst]["accuracy"],
        ">=",
        minimum,
        f"lowest of {sorted(real)}: {worst}",
    )


def _false_positives(sets: dict, maximum: float) -> dict[str, Any]:
    oos = _judged(sets, "out_of_scope")
    if not oos:
        return _rule(
            "false_positive_action_rate",
            None,
            "<=",
            maximum,
            "the data spec declares no out-of-scope evaluation set",
        )
    worst = max(oos, key=lambda n: oos[n]["false_positive_action_rate"])
    return _rule(
        "false_positive_action_rate",
        oos[worst]["false_positive_action_rate"],
        "<=",
        maximum,
        f"highest of {sorted(oos)}: {worst}",
    )


def _challenge(sets: dict, maximum: float | None) -> dict[str, Any]:
    if maximum is None:
        return _na("challenge_action_rate", "no challenge_action_rate_max in the gate spec")
    challenge = _judged(sets, "challenge")
    if not challenge:
        return _na("challenge_action_rate", "the data spec declares no challenge set to evaluate")
    worst = max(challenge, key=lambda n: challenge[n]["action_rate"])
    kinds = ", ".join(f"{k} {c['acted']}/{c['n']}" for k, c in challenge[worst]["by_kind"].items())
    return _rule(
        "challenge_action_rate",
        challenge[worst]["action_rate"],
        "<=",
        maximum,
        f"highest of {sorted(challenge)}: {worst} (acted on: {kinds})",
    )


def _against_production(test: dict, gate: GateSpec, prod: dict | None) -> dict[str, Any]:
    c = gate.compare_to_production
    if not c.enabled:
        return _na("not_worse_than_production", "disabled in the gate spec")
    if prod is None:
        return _na("not_worse_than_production", "no model in production yet")
    if not isinstance(prod.get("heldout_accuracy"), int | float):
        why = prod.get("unreadable") or "it has no heldout_accuracy"
        return _rule(
            "not_worse_than_production",
            None,
            ">=",
            None,
            f"models/production.json cannot be compared with: {why}; {RESTORE_PRODUCTION}",
        )
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
    return rule


def judge_lm(ev: dict | None, resume: dict | None, gate: GateSpec, prod: dict | None) -> list[dict]:
    """A language model's rules: validation bits per character, resume equivalence, and not
    worse than production on the same validation split."""
    t = gate.thresholds
    val = (ev or {}).get("sets", {}).get("validation", {})
    bpc = val.get("bits_per_char")
    rules = [
        _rule("val_bits_per_char", bpc, "<=", t.val_bits_per_char_max, "the whole validation split")
        if t.val_bits_per_char_max is not None
        else _na("val_bits_per_char", "no val_bits_per_char_max in the gate spec")
    ]
    if t.require_resume_equivalence:
        rules.append(_resume_rule(resume))
    c = gate.compare_to_production
    if not c.enabled:
        rules.append(_na("not_worse_than_production", "disabled in the gate spec"))
    elif prod is None:
        rules.append(_na("not_worse_than_production", "no model in production yet"))
    else:
        theirs = prod.get("val_bits_per_char")
        who = f"production {prod.get('model')} ({prod.get('model_version')})"
        rule = _rule("not_worse_than_production", bpc, "<=", theirs, who)
        ours_sha, theirs_sha = val.get("data_sha256"), prod.get("data_sha256", {}).get("validation")
        if theirs is None or (ours_sha and theirs_sha and ours_sha != theirs_sha):
            rule.update(
                verdict="fail",
                note=f"production {prod.get('model')} has no bits per character on this validation split "
                "(another model kind, or another split): not comparable. To move production on purpose, set "
                "compare_to_production.enabled: false for that promotion, then re-enable it.",
            )
        rules.append(rule)
    return rules


def _resume_rule(resume: dict | None) -> dict[str, Any]:
    return _rule(
        "resume_equivalence",
        (resume or {}).get("passed"),
        "==",
        True,
        (resume or {}).get("unreadable") or ("" if resume else "results/<m>/resume.json missing"),
    )


def resume_evidence(root: Path, name: str) -> dict[str, Any] | None:
    """resume.json of a trained model; for an ensemble, every member's must have passed."""
    spec_path = root / paths.model_spec(name)
    try:
        spec = load_spec(spec_path, ModelSpec) if spec_path.is_file() else None
    except UserError as e:
        # Edited since its stages ran: which members' evidence counts is unknown, so the rule
        # fails and says why, and the other candidates are still judged.
        why = f"specs/models/{name}.yaml no longer validates, so its resume evidence cannot be found: {e}"
        return {"unreadable": why}
    if spec is None or spec.family != "ensemble":
        return _read(root / paths.results_dir(name) / "resume.json", ResumeRecord)
    members = {
        m: _read(root / paths.results_dir(m) / "resume.json", ResumeRecord) for m in spec.ensemble.members
    }
    return {"passed": all(r is not None and r.get("passed") for r in members.values()), "members": members}


def decide(root: Path, models: list[str], gate_path: Path, kind: str = "classify") -> dict[str, Any]:
    gate = load_spec(gate_path, GateSpec)
    prod = production(root)
    lm = kind == "lm"
    candidates = {}
    for name in models:
        ev = _read(root / paths.results_dir(name) / "eval.json", LmEvaluation if lm else Evaluation)
        unreadable = (ev or {}).get("unreadable")
        ev = None if unreadable else ev
        resume = resume_evidence(root, name)
        rules = judge_lm(ev, resume, gate, prod) if lm else judge(name, ev, resume, gate, prod)
        sets = (ev or {}).get("sets", {})
        candidates[name] = {
            **({} if ev else {"not_evaluated": unreadable or True}),
            "passed": all(r["verdict"] != "fail" for r in rules),
            "heldout_accuracy": sets.get("test", {}).get("accuracy"),
            **({"val_bits_per_char": sets.get("validation", {}).get("bits_per_char")} if lm else {}),
            "model_version": (ev or {}).get("model_version"),
            "rules": rules,
        }

    # The best passing candidate: the highest held-out accuracy, or the fewest bits per character.
    def best(n: str) -> float:
        return candidates[n]["val_bits_per_char"] if lm else -candidates[n]["heldout_accuracy"]

    passing = sorted((n for n, c in candidates.items() if c["passed"]), key=best)
    reasons = []
    for n, c in candidates.items():
        failed = [r["rule"] for r in c["rules"] if r["verdict"] == "fail"]
        if isinstance(c.get("not_evaluated"), str):
            reasons.append(
                f"{n}: not evaluated (results/{n}/{c['not_evaluated']}; run "
                f"`dvc repro --force --single-item evaluate@{n}`, then `dvc repro`)"
            )
            continue
        if c.get("not_evaluated"):
            # Typically a model added to params.yaml after dvc.yaml was last compiled.
            reasons.append(
                f"{n}: not evaluated (no results/{n}/eval.json; after adding a model to params.yaml, "
                "run `reprogate compile`, then `dvc repro`)"
            )
            continue
        reasons.append(f"{n}: " + ("passed every rule" if not failed else f"failed {', '.join(failed)}"))
    if passing and len(passing) > 1:
        measure = "fewest validation bits per character" if lm else "best held-out accuracy"
        reasons.append(f"{passing[0]} has the {measure} among passing candidates")
    shown = "val_bits_per_char" if lm else "heldout_accuracy"
    result = {
        "passed": bool(passing),
        "chosen": passing[0] if passing else None,
        "reasons": reasons,
        "production": {k: prod.get(k) for k in ("model", "model_version", shown)} if prod else None,
        "gate_spec": str(gate_path.relative_to(root)) if gate_path.is_relative_to(root) else str(gate_path),
        "candidates": candidates,
    }
    decision = Decision.model_validate(result)
    write(root / paths.GATE_DECISION, decision)
    write(root / paths.GATE_METRICS, GateMetrics.of(decision))
    return result


def summary(r: dict[str, Any]) -> str:
    if r["passed"]:
        return f"gate: PASSED: {r['chosen']} may be promoted ({'; '.join(r['reasons'])})"
    return f"gate: no candidate passed ({'; '.join(r['reasons'])}); production stays as it is"


def run(ctx: Context) -> Result:
    pipe = load_pipeline(ctx.root)
    return Result(summary(decide(ctx.root, list(pipe.models), ctx.root / pipe.gate, pipe.kind)))
