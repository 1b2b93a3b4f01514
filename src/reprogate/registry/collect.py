"""What `reprogate registry sync` imports from one revision (a commit, or the working tree): for
each evaluated model a RunBundle (its `runs` row and the rows of its metrics, evaluations and
predictions), and the gate's decision rows.

Every file is read through the model its writer used (records.py): a damaged one is a problem
naming the file and field, and nothing of that run is imported. A run whose files are not all
there (not evaluated yet, DVC outputs not in the cache) is a note, said, and left out whole.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import yaml

from reprogate.records.base import record_key, validated
from reprogate.records.evaluation import Evaluation, LabelledSet, PredictionLine
from reprogate.records.gate import Decision
from reprogate.records.lm import LmTrainRecord
from reprogate.records.revision import Revision, record_size
from reprogate.records.runlog import UpdateLine
from reprogate.records.train import CombineRecord, Fingerprint, ModelConfig, TrainRecord, train_key
from reprogate.registry import checks
from reprogate.registry import lm as registry_lm
from reprogate.registry.checks import FIX
from reprogate.registry.tables import TABLES, arrow_schema, run_identity
from reprogate.specs.family import family
from reprogate.utils import paths
from reprogate.utils.errors import UserError
from reprogate.utils.hashing import content_key

_PREDICTION_SCHEMA = arrow_schema(PredictionLine)
RAW_NAMES = ("loss", "lr")  # the metrics_raw rows of one logged update


@dataclass
class RunBundle:
    run: dict[str, Any]  # a RunRow's fields
    rows: dict[str, pa.Table]  # registry_tables.RUN_TABLES -> this run's rows to import
    held: bool = False  # the registry has this run already: rows holds only new raw updates


@dataclass
class Collected:
    runs: list[RunBundle] = field(default_factory=list)
    gate: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # damaged records: one paragraph each
    notes: list[str] = field(default_factory=list)  # runs left out whole, and why
    same: int = 0  # runs whose records an earlier revision of this sync already held


def collect(rev: Revision, stamp: dict[str, Any], seen: set[str], held: dict[str, int]) -> Collected:
    """`stamp`: the rows' commit, committed_at and synced_at. `seen`: the signatures of runs
    already read in this sync (oldest commit first); a run with one of them is the same run
    again, and its DVC outputs are not read twice. `held`: run key -> raw metric rows of the
    runs the registry has; their predictions and metrics are not read again."""
    out = Collected()
    for model in _models(rev, out):
        rev.missing.clear()
        mark = signature(rev, model)
        if mark is not None and mark in seen:
            out.same += 1
            continue
        if mark is not None:
            seen.add(mark)  # imported, damaged or incomplete: the same again at a later commit
        try:
            bundle = _run(rev, model, stamp, held)
        except UserError as e:
            out.problems.append(f"{e} Nothing of run {model} at {rev.label} was imported.")
            continue
        if bundle is None:
            why = "; ".join(rev.missing) or "not evaluated (no results/<m>/eval.json)"
            out.notes.append(f"{model} at {rev.label}: left out ({why})")
        else:
            out.runs.append(bundle)
    try:
        out.gate = _gate(rev, {b.run["model"]: b.run["run_key"] for b in out.runs}, stamp)
    except UserError as e:
        out.problems.append(f"{e} The gate decision at {rev.label} was not imported.")
    return out


def _models(rev: Revision, out: Collected) -> list[str]:
    raw = rev.text(paths.PARAMS)
    try:
        models = (yaml.safe_load(raw) or {}).get("models") if raw else None
    except yaml.YAMLError:
        models = None
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        out.notes.append(f"{rev.label}: no readable params.yaml models list, so no runs to import")
        return []
    return models


def signature(rev: Revision, model: str) -> str | None:
    """What decides a model's run at a commit, from git alone: its git-tracked records and the
    dvc.lock hashes of its model folder and prediction files. Two commits with the same
    signature hold the same run. None for the working tree (its outputs may differ from its
    dvc.lock until `dvc repro` has run)."""
    if rev.rev is None:
        return None
    outs = {o["path"]: o for entry in rev.lock.values() for o in entry.get("outs", []) if "path" in o}
    folder, preds = paths.model_dir(model).as_posix(), paths.predictions_dir(model).as_posix()
    records = [
        paths.results_dir(model) / "eval.json", paths.metrics_dir(model) / "eval.json",
        paths.metrics_dir(model) / "train.json", paths.results_dir(model) / "resume.json",
        paths.plots_dir(model) / "train.tsv",
    ]  # fmt: skip
    return content_key(
        {
            "model": model,
            "records": [rev.blobs.get(p.as_posix()) for p in records],
            "outs": [outs.get(f"{folder}/{f}") for f in ("fingerprint.json", "config.json")]
            + [outs.get(preds)],
        }
    )


def _json(rev: Revision, path: Path, shape, dvc_output: bool = False):
    raw = rev.output(path) if dvc_output else rev.text(path)
    record_size(raw, f"registry: {path} at {rev.label}", FIX)
    return None if raw is None else validated(raw, shape, f"registry: {path} at {rev.label}", FIX)


def _run(rev: Revision, model: str, stamp: dict[str, Any], held: dict[str, int]) -> RunBundle | None:
    lm = rev.is_language_model(model)
    evaluation = rev.lm_evaluation(model) if lm else rev.evaluation(model)
    if evaluation is None:
        return None
    fp = _json(rev, paths.model_dir(model) / "fingerprint.json", Fingerprint, dvc_output=True)
    config = _json(rev, paths.model_dir(model) / "config.json", ModelConfig, dvc_output=True)
    if fp is None or config is None:
        return None
    trained = family(config.family).trained
    record_shape = LmTrainRecord if lm else TrainRecord if trained else CombineRecord
    record = _json(rev, paths.metrics_dir(model) / "train.json", record_shape)
    run = (registry_lm.run_row if lm else _run_row)(model, evaluation, fp, config, record, stamp)
    run["resume_passed"] = getattr(rev.resume(model), "passed", None)
    key = run["run_key"]
    if key in held:
        return RunBundle(run, _grown(rev, model, run["train_key"], key, held[key]) if trained else {}, True)
    predictions = []
    for name in [] if lm else evaluation.sets:  # a language model's samples are not predictions
        text = rev.output(paths.predictions_dir(model) / f"{name}.jsonl")
        if text is None:
            return None
        where = f"registry: {paths.predictions_dir(model) / name}.jsonl at {rev.label}"
        predictions.append(_predictions(text, where, key, name))
    rows = {
        "predictions": pa.concat_tables(predictions) if predictions else _empty("predictions"),
        "evaluations": _table(
            "evaluations", registry_lm.evaluations(key, evaluation) if lm else _evaluations(key, evaluation)
        ),
        "metrics": _table("metrics", _curve(rev, model, key) if trained else []),
        "metrics_raw": _table("metrics_raw", _raw(rev, model, run["train_key"], key) if trained else []),
    }
    checks.finite(f"{model} at {rev.label}", model, run, rows)
    return RunBundle(run, rows)


def _grown(rev: Revision, model: str, train: str | None, run_key: str, rows_held: int) -> dict:
    """A held run's raw updates, when its log has more lines than the registry has rows (counted,
    not parsed: a no-op sync reads every held run's log)."""
    path = _update_log(rev, model, train)
    if path is None or len(RAW_NAMES) * path.read_bytes().count(b"\n") <= rows_held:
        return {}
    return {"metrics_raw": _table("metrics_raw", _raw(rev, model, train, run_key))}


def _run_row(model, evaluation: Evaluation, fp: Fingerprint, config: ModelConfig, record, stamp) -> dict:
    spec, policy = config.spec, evaluation.policy
    heldout = evaluation.sets.get(evaluation.heldout)
    return {
        **run_identity(model, fp, spec, record_key(evaluation)),
        "family": config.family,
        "model_version": evaluation.model_version,
        "train_key": train_key(fp) if family(config.family).trained else None,
        "processes": int(spec.get("processes", 1)),
        "device": evaluation.device,
        "steps": getattr(record, "steps", None),
        "epochs": getattr(record, "epochs", None),
        "final_loss": getattr(record, "final_loss", None),
        "validation_accuracy": getattr(record, "validation_accuracy", None),
        "temperature": evaluation.temperature,
        "threshold": policy.threshold if policy else None,
        "margin": policy.margin if policy else None,
        "heldout_set": evaluation.heldout,
        "heldout_accuracy": heldout.accuracy if isinstance(heldout, LabelledSet) else None,
        "members": sorted(f"{m}@{v['model'][:12]}" for m, v in (fp.members or {}).items()),
        **stamp,
    }


def _empty(table: str) -> pa.Table:
    return TABLES[table].schema.empty_table()


def _table(table: str, rows: list[dict[str, Any]]) -> pa.Table:
    try:
        return pa.Table.from_pylist(rows, schema=TABLES[table].schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:  # e.g. a count past 2**63
        raise UserError(f"registry: a {table} row does not fit its column ({e}); {FIX}") from None


def _predictions(text: str, where: str, run_key: str, set_name: str) -> pa.Table:
    """A prediction file as rows, read by Arrow with the schema generated from PredictionLine
    (fast: 3,000 lines in milliseconds); a file Arrow cannot read that way is read again line by
    line with PredictionLine itself, which names the line and field."""
    data = text.encode()
    checks.lines(data, where)
    try:
        raw = pj.read_json(
            io.BytesIO(data),
            parse_options=pj.ParseOptions(
                explicit_schema=_PREDICTION_SCHEMA, unexpected_field_behavior="ignore"
            ),
        )
        required = [f.name for f in _PREDICTION_SCHEMA if not f.nullable]
        if any(raw.column(name).null_count for name in required):
            raise pa.ArrowInvalid("a required field is missing")
    except pa.ArrowInvalid:
        for number, line in enumerate(text.split("\n"), start=1):
            if line.strip():
                validated(line, PredictionLine, f"{where}:{number}", FIX)
        raise UserError(f"{where}: not JSON Lines of predictions; {FIX}") from None
    if raw.num_rows == 0:
        return _empty("predictions")
    checks.unique_ids(raw.column("id"), where)
    gold, predicted = raw.column("gold"), raw.column("predicted")
    columns = {
        "run_key": pa.array([run_key] * raw.num_rows),
        "set": pa.array([set_name] * raw.num_rows),
        "item_id": raw.column("id"),
        "text": raw.column("text"),
        "gold": gold,
        "predicted": predicted,
        "probability": raw.column("probability"),
        "correct": pc.equal(gold, predicted),  # null where there is no gold label
        "route": raw.column("route"),
        "reasons": raw.column("reasons"),
        "alternatives": raw.column("alternatives"),
    }
    schema = TABLES["predictions"].schema
    return pa.Table.from_pydict(columns).cast(schema)


def _evaluations(run_key: str, evaluation: Evaluation) -> list[dict[str, Any]]:
    rows = []
    for name, s in evaluation.sets.items():
        numbers = s.model_dump(mode="json", exclude_unset=True)
        checks.count(s.n, f"results/<model>/eval.json: field 'sets.{name}.n'")
        for metric, value in sorted(numbers.items()):
            if metric == "n" or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            ci = numbers.get(f"{metric}_ci95")
            rows.append(
                {
                    "run_key": run_key, "set": name, "metric": metric, "kind": s.kind, "value": float(value),
                    "ci_low": ci[0] if ci else None, "ci_high": ci[1] if ci else None,
                    "n": s.n, "data_sha256": s.data_sha256,
                }
            )  # fmt: skip
        for kind, c in getattr(s, "by_kind", {}).items():  # a challenge set's acceptance per kind
            rows.append(
                {
                    "run_key": run_key, "set": name, "metric": f"action_rate.{kind}", "kind": s.kind,
                    "value": c.action_rate, "ci_low": None, "ci_high": None, "n": c.n,
                    "data_sha256": s.data_sha256,
                }
            )  # fmt: skip
    return rows


def _curve(rev: Revision, model: str, run_key: str) -> list[dict[str, Any]]:
    """plots/<m>/train.tsv: the loss and learning rate of each step the final model kept."""
    path = paths.plots_dir(model) / "train.tsv"
    text = rev.text(path)
    if text is None:
        return []
    lines = text.splitlines()
    header = lines[0].split("\t") if lines else []
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        cells = line.split("\t")
        try:
            step, values = int(cells[0]), [float(c) for c in cells[1:]]
        except ValueError:
            raise UserError(
                f"registry: {path}:{number} at {rev.label}: '{line}' is not step<TAB>numbers; {FIX}"
            ) from None
        if len(values) != len(header) - 1:
            raise UserError(
                f"registry: {path}:{number} at {rev.label}: {len(cells)} columns, the header "
                f"{len(header)}; {FIX}"
            )
        rows += [
            {"run_key": run_key, "step": step, "name": n, "value": v}
            for n, v in zip(header[1:], values, strict=True)
        ]
    return rows


def _update_log(rev: Revision, model: str, train: str | None) -> Path | None:
    """runs/<m>/updates/<train key>.jsonl, when there is one: the working tree only (runs/ is
    neither in git nor in DVC)."""
    if rev.rev is not None or train is None:
        return None
    path = rev.root / paths.update_log(paths.run_dir(model), train)
    return path if path.is_file() else None


def _raw(rev: Revision, model: str, key: str | None, run_key: str) -> list[dict[str, Any]]:
    """Every update of the run's log as logged, a row per name in RAW_NAMES. A last line
    without its newline is a write a kill cut short."""
    path = _update_log(rev, model, key)
    if path is None:
        return []
    data = path.read_text(encoding="utf-8")
    lines = data.split("\n")
    if lines and lines[-1] and not data.endswith("\n"):
        lines = lines[:-1]  # cut short by a kill: the update is in the next attempt's lines
    rows, seq = [], 0
    for number, line in enumerate(lines, start=1):
        if not line:
            continue
        u = validated(line, UpdateLine, f"registry: {path}:{number}", FIX)
        for name in RAW_NAMES:
            rows.append(
                {"run_key": run_key, "seq": seq, "step": u.step, "name": name, "value": getattr(u, name),
                 "attempt": u.attempt, "logged_at": u.at}
            )  # fmt: skip
            seq += 1
    return rows


def _gate(rev: Revision, run_keys: dict[str, str], stamp: dict[str, Any]) -> list[dict[str, Any]]:
    decision: Decision | None = rev.gate
    if decision is None:
        return []
    gate_key = record_key(decision)
    rows = []
    for name, c in sorted(decision.candidates.items()):
        rules = c.rules or []
        base = {
            "gate_key": gate_key, "candidate": name, "run_key": run_keys.get(name),
            "model_version": c.model_version, "candidate_passed": c.passed, "chosen": decision.chosen == name,
            "decision_passed": decision.passed, "gate_spec": decision.gate_spec, **stamp,
        }  # fmt: skip
        if not rules:  # not evaluated: one row says so
            why = c.not_evaluated if isinstance(c.not_evaluated, str) else "no eval.json"
            rows.append({**base, "rule": "evaluated", "value": None, "op": None, "threshold": None,
                         "verdict": "fail", "note": why})  # fmt: skip
        for r in rules:
            rows.append(
                {**base, "rule": r.rule, "value": json.dumps(r.value), "op": r.op,
                 "threshold": json.dumps(r.threshold), "verdict": r.verdict, "note": r.note}
            )  # fmt: skip
    return rows
