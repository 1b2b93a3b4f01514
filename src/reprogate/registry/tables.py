"""The run registry's tables: one pydantic model per row, each Delta table's schema generated
from it, and the columns that key it.

Every key is derived from content (hashing.content_key), never a random id: a second import
of the same records finds its rows, so a keyed MERGE inserts nothing. Types stay inside Delta's
base protocol (reader 1 / writer 2): strings, 64-bit integers, doubles, booleans, lists,
structs and `timestamp` in UTC (never `timestamp_ntz`, a table feature Spark must opt into).

| table          | one row per                         | key                          |
| -------------- | ----------------------------------- | ---------------------------- |
| runs           | model trained, calibrated, evaluated | run_key                     |
| metrics_raw    | logged update value, repeats kept   | run_key, seq                 |
| metrics        | step and name (the value kept)      | run_key, step, name          |
| evaluations    | set and metric, with its interval   | run_key, set, metric         |
| predictions    | set and item                        | run_key, set, item_id        |
| gate_decisions | gate decision, candidate and rule   | gate_key, candidate, rule    |
| promotions     | promotion commit                    | commit                       |
| stage_runs     | run of a stage (its telemetry)      | stage, host, finished_at     |
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
from pydantic import AwareDatetime, BaseModel, ConfigDict

from reprogate.records.train import Fingerprint
from reprogate.utils.hashing import content_key


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunRow(Row):
    """A model's pass through the pipeline at one state of its inputs. run_key hashes what made
    it (model, spec_hash, data_hash, code_hash, seed, executor) and the evaluation it produced
    (evaluation_sha256, which holds the model version and calibrated policy): the same inputs
    reproduce the same key, and a re-evaluation that moved a number is a new run."""

    run_key: str
    model: str
    family: str
    model_version: str | None
    train_key: str | None  # the training's fingerprint key (runs/<m>/updates/<train_key>.jsonl)
    spec_hash: str
    data_hash: str | None  # None for an ensemble: its members' data is in members
    code_hash: str | None
    seed: int | None
    executor: str
    processes: int
    evaluation_sha256: str
    device: str | None
    steps: int | None
    epochs: int | None
    final_loss: float | None
    validation_accuracy: float | None
    temperature: float | None
    threshold: float | None
    margin: float | None
    heldout_set: str
    heldout_accuracy: float | None
    resume_passed: bool | None
    members: list[str]  # an ensemble's members, as name@version of their weights
    commit: str | None  # the oldest commit found holding these records; None: only a working tree
    committed_at: AwareDatetime | None
    synced_at: AwareDatetime


def executor(spec: dict) -> str:
    """torch or ray for ranks under an engine; local for one process in the stage itself (the
    key runs had before the spec had an executor). The same for every family."""
    name = str(spec.get("executor", "torch"))
    return name if name != "torch" or spec.get("processes", 1) > 1 else "local"


def run_identity(model: str, fp: Fingerprint, spec: dict, evaluation_sha256: str) -> dict[str, Any]:
    """What makes a run, any family (docs/registry.md), and run_key, its content key."""
    identity = {
        "model": model,
        "spec_hash": fp.spec_hash,
        "data_hash": fp.data_hash,
        "code_hash": fp.code_hash,
        "seed": spec.get("seed"),
        "executor": executor(spec),
        "evaluation_sha256": evaluation_sha256,
    }
    return {"run_key": content_key(identity), **identity}


class MetricRawRow(Row):
    run_key: str
    seq: int  # order logged: a resumed run's repeated steps come again with higher seq
    step: int
    name: str
    value: float
    attempt: AwareDatetime  # when the process that logged it started
    logged_at: AwareDatetime


class MetricRow(Row):
    run_key: str
    step: int
    name: str
    value: float


class EvaluationRow(Row):
    run_key: str
    set: str
    metric: str
    kind: str  # labelled, real_utterance, out_of_scope, challenge
    value: float | None
    ci_low: float | None
    ci_high: float | None
    n: int | None
    data_sha256: str | None


class AlternativeRow(Row):
    intent: str
    probability: float


class PredictionRow(Row):
    run_key: str
    set: str
    item_id: str
    text: str
    gold: str | None
    predicted: str
    probability: float
    correct: bool | None  # None on a set without labels
    route: str
    reasons: list[str]
    alternatives: list[AlternativeRow]


class GateDecisionRow(Row):
    gate_key: str  # the decision's content, hashed
    candidate: str
    rule: str
    run_key: str | None  # the candidate's run in the same records
    model_version: str | None
    candidate_passed: bool
    chosen: bool
    decision_passed: bool
    value: str | None  # JSON: a rule's value and threshold may be a number, a list or text
    op: str | None
    threshold: str | None
    verdict: str
    note: str | None
    gate_spec: str | None
    commit: str | None
    committed_at: AwareDatetime | None
    synced_at: AwareDatetime


class PromotionRow(Row):
    commit: str
    committed_at: AwareDatetime
    subject: str
    tag: str | None
    model: str | None
    model_version: str | None
    heldout_accuracy: float | None
    code_commit: str | None  # the commit whose gate and records the promotion checked


class StageRunRow(Row):
    stage: str
    host: str
    finished_at: AwareDatetime
    model: str | None
    code_commit: str | None
    code_dirty: bool | None
    wall_s: float | None
    peak_rss_gb: float | None
    examples_per_s: float | None
    train_key: str | None
    telemetry: str  # the whole RunLogEntry.telemetry, as JSON


@dataclass(frozen=True)
class Table:
    name: str
    row: type[Row]
    key: tuple[str, ...]

    @property
    def schema(self) -> pa.Schema:
        return arrow_schema(self.row)


# The order a sync writes them in: `runs` last, so a run listed there has all its rows.
TABLES = {
    t.name: t
    for t in (
        Table("metrics_raw", MetricRawRow, ("run_key", "seq")),
        Table("metrics", MetricRow, ("run_key", "step", "name")),
        Table("evaluations", EvaluationRow, ("run_key", "set", "metric")),
        Table("predictions", PredictionRow, ("run_key", "set", "item_id")),
        Table("gate_decisions", GateDecisionRow, ("gate_key", "candidate", "rule")),
        Table("promotions", PromotionRow, ("commit",)),
        Table("stage_runs", StageRunRow, ("stage", "host", "finished_at")),
        Table("runs", RunRow, ("run_key",)),
    )
}
RUN_TABLES = ("metrics_raw", "metrics", "evaluations", "predictions")  # rows that belong to a run

_SCALARS: dict[type, pa.DataType] = {
    str: pa.string(),
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
    datetime: pa.timestamp("us", tz="UTC"),
    AwareDatetime: pa.timestamp("us", tz="UTC"),
}


def _arrow_type(annotation) -> tuple[pa.DataType, bool]:
    """(Arrow type, nullable) of a row field's annotation."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return _arrow_type(inner)[0], True
    if typing.get_origin(annotation) is typing.Literal:
        (kind,) = {type(a) for a in args}
        return _SCALARS[kind], False
    if typing.get_origin(annotation) is list:
        item, nullable = _arrow_type(args[0])
        return pa.list_(pa.field("element", item, nullable=nullable)), False
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return pa.struct(_fields(annotation)), False
    if annotation in _SCALARS:
        return _SCALARS[annotation], False
    raise TypeError(f"no Arrow type for {annotation!r}")


def _fields(model: type[BaseModel]) -> list[pa.Field]:
    fields = []
    for name, info in model.model_fields.items():
        kind, nullable = _arrow_type(info.annotation)
        fields.append(pa.field(name, kind, nullable=nullable))
    return fields


def arrow_schema(model: type[BaseModel]) -> pa.Schema:
    """The table's schema, generated from its row model (a field that may be None is nullable)."""
    return pa.schema(_fields(model))
