"""Stage `gate`: every candidate against specs/gate.yaml and the production model.

Reads results/<m>/eval.json and results/<m>/resume.json of every model in params.yaml and
models/production.json, and writes results/gate.json: per candidate, per rule, the value,
the threshold and the verdict (the rules are the kind's table, pipeline/kinds.py); then the
chosen candidate (the best by the kind's ranking among those passing every rule) or none, with
reasons. Its headline, metrics/gate.json, holds the
verdicts. A failed gate is a recorded decision: the
stage succeeds and promotion refuses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reprogate.pipeline.context import Context, Result
from reprogate.pipeline.kinds import KINDS
from reprogate.records.base import Record, parse, write
from reprogate.records.export import ExportRecord
from reprogate.records.gate import CandidateRow, Decision, GateMetrics
from reprogate.records.production import ProductionRecord
from reprogate.records.resume import ResumeRecord
from reprogate.specs.gate import GateSpec
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from reprogate.specs.pipeline import Pipeline, load_pipeline
from reprogate.utils import paths
from reprogate.utils.errors import UserError

PER_MODEL = None


def dvc(p: Pipeline) -> dict[str, Any]:
    evidence = [f"results/{m}/eval.json" for m in p.models]
    evidence += [f"results/{m}/resume.json" for m, spec in p.models.items() if spec.trained]
    evidence += [f"metrics/{m}/export.json" for m, spec in p.models.items() if spec.family_def.compiled]
    decision, headline = (f.as_posix() for f in paths.gate_files(p.part))
    lists = ["models"] if p.part == "default" else ["models", "experiments"]
    return {
        "deps": [*evidence, "models/production.json"],
        "params": [{p.gate: None}, {"params.yaml": lists}],
        "outs": [{decision: {"cache": False}}],
        "metrics": [
            {headline: {"cache": False}},
            *({paths.candidate_row(m).as_posix(): {"cache": False}} for m in p.builds or p.models),
        ],
    }


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


def export_evidence(root: Path, name: str) -> dict[str, Any] | None:
    """metrics/<m>/export.json of an export (None for any other candidate)."""
    spec_path = root / paths.model_spec(name)
    try:
        spec = load_spec(spec_path, ModelSpec) if spec_path.is_file() else None
    except UserError:  # resume_evidence records why; its rule fails
        return None
    if spec is None or not spec.family_def.compiled:
        return None
    return _read(root / paths.metrics_dir(name) / "export.json", ExportRecord) or {
        "unreadable": f"metrics/{name}/export.json missing"
    }


def resume_evidence(root: Path, name: str) -> dict[str, Any] | None:
    """resume.json of a trained model; of one built from several (an ensemble), every member's
    must have passed; one built from one source (an export) is as resumable as its source."""
    spec_path = root / paths.model_spec(name)
    try:
        spec = load_spec(spec_path, ModelSpec) if spec_path.is_file() else None
    except UserError as e:
        # Edited since its stages ran: which members' evidence counts is unknown, so the rule
        # fails and says why, and the other candidates are still judged.
        why = f"specs/models/{name}.yaml no longer validates, so its resume evidence cannot be found: {e}"
        return {"unreadable": why}
    if spec is None or spec.trained:
        return _read(root / paths.results_dir(name) / "resume.json", ResumeRecord)
    sources = spec.family_def.sources(spec)
    if len(sources) == 1:
        return resume_evidence(root, sources[0])
    members = {m: _read(root / paths.results_dir(m) / "resume.json", ResumeRecord) for m in sources}
    return {"passed": all(r is not None and r.get("passed") for r in members.values()), "members": members}


def decide(
    root: Path,
    models: list[str],
    gate_path: Path,
    kind: str = "classify",
    part: str = "default",
    rows: tuple[str, ...] | None = None,  # whose metrics/candidates/<m>.json it writes (default: all)
) -> dict[str, Any]:
    gate = load_spec(gate_path, GateSpec)
    prod = production(root)
    k = KINDS[kind]
    candidates = {}
    for name in models:
        ev = _read(root / paths.results_dir(name) / "eval.json", k.evaluation)
        unreadable = (ev or {}).get("unreadable")
        ev = None if unreadable else ev
        rules = k.judge(ev, resume_evidence(root, name), gate, prod, export_evidence(root, name))
        sets = (ev or {}).get("sets", {})
        c = {
            **({} if ev else {"not_evaluated": unreadable or True}),
            "passed": all(r["verdict"] != "fail" for r in rules),
            "heldout_accuracy": sets.get("test", {}).get("accuracy"),
        }
        c[k.ranking.field] = sets.get(k.ranking.split, {}).get(k.ranking.metric)
        candidates[name] = c | {"model_version": (ev or {}).get("model_version"), "rules": rules}

    passing = sorted(
        (n for n, c in candidates.items() if c["passed"]), key=lambda n: k.ranking.key(candidates[n])
    )
    reasons = [_reason(n, c) for n, c in candidates.items()]
    if passing and len(passing) > 1:
        reasons.append(f"{passing[0]} has the {k.ranking.words} among passing candidates")
    shown = ("model", "model_version", k.ranking.field)
    result = {
        "passed": bool(passing),
        "chosen": passing[0] if passing else None,
        "reasons": reasons,
        "production": {f: prod.get(f) for f in shown} if prod else None,
        "gate_spec": str(gate_path.relative_to(root)) if gate_path.is_relative_to(root) else str(gate_path),
        "candidates": candidates,
    }
    decision = Decision.model_validate(result)
    decision_file, headline_file = paths.gate_files(part)
    write(root / decision_file, decision)
    write(root / headline_file, GateMetrics.of(decision))
    for name in rows if rows is not None else models:
        write(root / paths.candidate_row(name), CandidateRow.of(decision.candidates[name], k.columns))
    return result


def _reason(n: str, c: dict[str, Any]) -> str:
    if isinstance(c.get("not_evaluated"), str):
        return (
            f"{n}: not evaluated (results/{n}/{c['not_evaluated']}; run "
            f"`dvc repro --force --single-item evaluate@{n}`, then `dvc repro`)"
        )
    if c.get("not_evaluated"):
        # Typically a model added to params.yaml after dvc.yaml was last compiled.
        return (
            f"{n}: not evaluated (no results/{n}/eval.json; after adding a model to params.yaml, "
            "run `reprogate compile`, then `dvc repro`)"
        )
    failed = [r["rule"] for r in c["rules"] if r["verdict"] == "fail"]
    return f"{n}: " + ("passed every rule" if not failed else f"failed {', '.join(failed)}")


def summary(r: dict[str, Any]) -> str:
    if r["passed"]:
        return f"gate: PASSED: {r['chosen']} may be promoted ({'; '.join(r['reasons'])})"
    return f"gate: no candidate passed ({'; '.join(r['reasons'])}); production stays as it is"


def run(ctx: Context) -> Result:
    pipe = load_pipeline(ctx.root, ctx.pipeline)
    said = summary(
        decide(ctx.root, list(pipe.models), ctx.root / pipe.gate, pipe.kind, pipe.part, pipe.builds)
    )
    return Result(said if pipe.part == "default" else f"{pipe.part} {said}")
