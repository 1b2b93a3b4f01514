"""The files one stage writes and another reads, one pydantic model each.

The writer builds the model and `write` dumps exactly the fields it set; every reader validates the file
against the same model (strictly: a string is never read as a number), so a hand edit, a merge conflict or a
file from another tool is named by its field, never a KeyError three modules away. Extra fields are kept: a
newer writer's record still reads.

| file                          | model             | written by        | read by                      |
| ----------------------------- | ----------------- | ----------------- | ---------------------------- |
| results/data.json             | DataRecord        | prepare           | promote                      |
| models/<m>/config.json        | ModelConfig       | train, combine    | model_folder, promote        |
| models/<m>/fingerprint.json   | Fingerprint       | train, combine    | model_folder, promote        |
| metrics/<m>/train.json        | TrainRecord       | train             | dvc metrics, report          |
|                               | CombineRecord     | combine           | dvc metrics, report          |
| models/<m>/calibration.json   | CalibrationRecord | calibrate         | calibration, promote         |
| results/<m>/eval.json         | Evaluation        | evaluate          | gate, promote, report        |
| predictions/<m>/<set>.jsonl   | PredictionLine    | evaluate          | the registry (report: 4 keys)|
| results/<m>/resume.json       | ResumeRecord      | resume_check      | gate, report                 |
| results/gate.json             | Decision          | gate              | promote, report              |
| models/production.json        | ProductionRecord  | promote           | gate, production (serving)   |
| logs/<stage>.jsonl (a line)   | RunLogEntry       | every timed stage | people, the registry         |
| runs/<m>/updates/<k>.jsonl    | UpdateLine        | train (rank 0)    | the registry (metrics_raw)   |
| <git dir>/reprogate/promotion.json | PromotionJournal | promote | promote (a rerun after a kill) |

DVC metric files derived from these (metrics/data.json, <m>/eval.json, resume.json, gate.json): headline.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reprogate.utils.errors import UserError, first_problem, read_json
from reprogate.utils.hashing import content_key


class Record(BaseModel):
    model_config = ConfigDict(extra="allow")


R = TypeVar("R", bound=Record)
Interval = Annotated[list[float], Field(min_length=2, max_length=2)]


def dumps(record: Record, indent: int = 2) -> str:
    """The record as its file holds it: the fields its writer set, keys sorted."""
    return (
        json.dumps(record.model_dump(mode="json", exclude_unset=True), indent=indent, sort_keys=True) + "\n"
    )


def write(path: Path, record: Record, indent: int = 2) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(record, indent))


def validated(raw: str | bytes | dict, shape: type[R], where: str, fix: str) -> R:
    """`raw` (JSON text, or parsed) as `shape`, strictly; or a paragraph naming `where`, field, `fix`."""
    try:
        if isinstance(raw, dict):
            return shape.model_validate(raw, strict=True)
        return shape.model_validate_json(raw, strict=True)
    except ValidationError as e:
        field, found = first_problem(e)
        raise UserError(f"{where}: field '{field}': {found}; {fix}") from None


def load(path: Path, shape: type[R], fix: str) -> R:
    """A record reprogate wrote, or one paragraph naming the file, the field and `fix`."""
    return validated(read_json(path, fix), shape, str(path), fix)


def parse(path: Path, shape: type[R]) -> tuple[R | None, str | None]:
    """(record, None) for a file of this shape; (None, why) for a damaged one (truncated, a merge
    conflict, a field of the wrong type), why naming the file's field; (None, None) if absent."""
    if not path.is_file():
        return None, None
    try:
        return shape.model_validate_json(path.read_bytes(), strict=True), None
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        if first["type"] in ("json_invalid", "json_type"):
            return None, f"{path.name} is not valid JSON ({first['ctx'].get('error', first['msg'])})"
        if first["type"] == "model_type":
            return None, f"{path.name} is not a JSON object"
        # Drop the tags pydantic adds for the set kinds: the user sees sets.test.accuracy.
        field, found = first_problem(e, skip=("labelled", "real_utterance", "out_of_scope", "challenge"))
        return None, f"{path.name} does not have the fields reprogate writes ({field}: {found})"


class DataRecord(Record):
    dataset: str
    labels: int
    rows: dict[str, int]
    dropped: dict[str, dict[str, int]]
    audit: dict[str, dict[str, int]]
    sha256: dict[str, str]  # split -> sha256 of data/prepared/<split>.jsonl
    raw_sha256: dict[str, str]


# ---------------------------------------------------------------- train and combine


class ModelConfig(Record):
    family: Literal["ngram", "encoder", "ensemble", "causal_lm", "export"]
    n_out: int
    featurizer: dict[str, Any]  # what the features depend on (the featurizer's key)
    spec: dict[str, Any]  # the model spec it was trained from, validated again on load


class Fingerprint(Record):
    """Where a model folder came from: spec, data, code, packages, or an ensemble's member versions."""

    spec_hash: str
    data_hash: str | None = None
    labels_hash: str | None = None
    code_hash: str | None = None
    environment: dict[str, str] | None = None
    encoder_sha256: str | None = None
    total_steps: int | None = None
    members: dict[str, Any] | None = None  # member -> sha256 of its weights and calibration


def record_key(record: Record) -> str:
    """The content key of a record as its file holds it (the fields its writer set)."""
    return content_key(record.model_dump(mode="json", exclude_unset=True))


def train_key(fingerprint: Fingerprint) -> str:
    """What a training run is, as a key: its fingerprint (spec, data, code, environment, steps).
    Its raw update log is named by it, and the registry joins a run to that log by it."""
    return record_key(fingerprint)


class TrainRecord(Record):
    """What a run trained to: the same numbers whenever the same inputs are trained again (how
    long it took and how much memory it used are telemetry, in its RunLogEntry)."""

    steps: int
    epochs: int
    examples: int
    final_loss: float | None
    validation_accuracy: float
    truncated_texts: int


class CombineRecord(Record):
    weights: dict[str, float]
    calibration_nll: float
    validation_accuracy: float
    member_validation_accuracy: dict[str, float]
    weights_note: str | None = None


# ---------------------------------------------------------------------------- calibrate


class PolicyRecord(Record):
    threshold: float  # act only when the calibrated top-1 probability is at least this
    margin: float  # ... and top-1 minus top-2 is at least this
    # Requests no single intent answers (predict/requests.py); None: the rule is off.
    two_requests: float | None = None  # least confidence of two clauses that name different intents
    ambiguous: float | None = None  # normalised entropy of the probabilities at or above this
    too_short: int | None = None  # at most this many words


class CalibrationRecord(Record):
    temperature: float
    policy: PolicyRecord
    fitted_on: dict[str, Any] | None = None
    limits: dict[str, Any] | None = None
    on_calibration_data: dict[str, Any] | None = None
    warnings: list[str] = []


# ----------------------------------------------------------------------------- evaluate


SetUse = Literal["evaluate", "calibrate"]


class LabelledSet(Record):
    """validation and test, or a set of real utterances (kind real_utterance)."""

    kind: Literal["labelled", "real_utterance"]
    accuracy: float
    n: int | None = None
    use: SetUse | None = None  # calibrate: model choices may have looked at it; the gate skips it
    data_sha256: str | None = None
    macro_f1: float | None = None
    accuracy_ci95: Interval | None = None
    macro_f1_ci95: Interval | None = None
    ece_before: float | None = None
    ece_after: float | None = None
    nll: float | None = None
    coverage: float | None = None
    acted_accuracy: float | None = None
    wrong_action_rate: float | None = None
    wrong_actions: int | None = None
    # real utterances predicted out of scope: in-domain requests the model took for "not banking"
    predicted_out_of_scope: int | None = None


class OutOfScopeSet(Record):
    kind: Literal["out_of_scope"]
    false_positive_action_rate: float
    n: int | None = None
    use: SetUse | None = None
    data_sha256: str | None = None
    coverage: float | None = None


class KindCount(Record):
    n: int
    acted: int
    action_rate: float


class ChallengeSet(Record):
    """Queries no single intent answers: acting on one is a mistake, counted per kind."""

    kind: Literal["challenge"]
    action_rate: float
    n: int
    acted: int
    by_kind: dict[str, KindCount]
    use: SetUse | None = None
    data_sha256: str | None = None


EvalSetRecord = Annotated[LabelledSet | OutOfScopeSet | ChallengeSet, Field(discriminator="kind")]


class Evaluation(Record):
    heldout: str = "test"
    device: str | None = None
    model_version: str | None = None
    temperature: float | None = None
    policy: PolicyRecord | None = None
    sets: dict[str, EvalSetRecord] = {}


class Alternative(Record):
    intent: str
    probability: float


class PredictionLine(Record):
    """One line of predictions/<m>/<set>.jsonl: the item, its gold label (None on a set without
    labels) and the Prediction object of docs/design.md, the answer named `predicted`."""

    id: str
    text: str
    gold: str | None
    predicted: str
    probability: float
    alternatives: list[Alternative]
    route: Literal["act", "review"]
    reasons: list[str]
    model_version: str
    kind: str | None = None  # a challenge set's kind of query (unrelated, ambiguous, ...)


# ------------------------------------------------------------------------- resume_check


class FieldCheck(Record):
    max_abs_diff: float | Literal["inf"]  # inf: shapes, keys or values differ
    tolerance: float
    verdict: Literal["pass", "fail"]


class ResumeRecord(Record):
    passed: bool | None = None
    device: str | None = None
    processes: int | None = None
    engine: str | None = None  # in-process, torch-elastic or ray
    killed_rank: int | None = None  # None: every process killed; restarts: by the engine itself
    restarts: int | None = None
    cause: str | None = None
    tolerance: float | None = None
    steps: int | None = None
    checkpoint_every: int | None = None
    killed_after_step: int | None = None
    kill_signal: str | None = None
    child_returncode: int | None = None
    restored_step: int | None = None
    final_step: int | None = None
    fields: dict[str, FieldCheck] | None = None


# --------------------------------------------------------------------------------- gate


class Rule(Record):
    rule: str
    value: Any
    op: str | None
    threshold: Any
    verdict: Literal["pass", "fail", "n/a"]
    note: str | None = None


class Candidate(Record):
    passed: bool
    heldout_accuracy: float | None
    val_bits_per_char: float | None = None  # a language model's
    model_version: str | None
    rules: list[Rule]
    not_evaluated: bool | str | None = None  # True: no eval.json; a string: why it is unreadable


class Decision(Record):
    """results/gate.json: every candidate's rules, and the one chosen (or none, with reasons)."""

    passed: bool
    chosen: str | None
    reasons: list[str]
    candidates: dict[str, Candidate]
    production: dict[str, Any] | None = None
    gate_spec: str | None = None


# ---------------------------------------------------------------------------- promote


class PinnedPolicy(Record):
    temperature: float
    threshold: float
    margin: float
    two_requests: float | None = None
    ambiguous: float | None = None
    too_short: int | None = None


# How to recover models/production.json, said wherever it is found damaged.
RESTORE_PRODUCTION = (
    "only `reprogate promote` writes it: restore the committed record with "
    "`git checkout HEAD -- models/production.json` (after a merge conflict, take one side whole)"
)


class ProductionRecord(Record):
    """models/production.json. Before the first promotion it holds {"model": null}."""

    model: str | None = None
    model_version: str | None = None
    family: str | None = None
    artifacts: dict[str, str] | None = None
    data_sha256: dict[str, str] = {}
    spec_hashes: dict[str, str] | None = None
    code_commit: str | None = None
    heldout_accuracy: float | None = None
    heldout_accuracy_ci95: Interval | None = None
    val_bits_per_char: float | None = None  # a language model's, on its validation split
    calibration: PinnedPolicy | None = None
    gate: dict[str, dict[str, Any]] | None = None


class Promoted(ProductionRecord):
    """A production record with a model in it: what predict and serve answer with."""

    model: str
    model_version: str


class PromotionJournal(Record):
    """<git dir>/reprogate/promotion.json: a promotion checked at `base`, until committed and tagged."""

    base: Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")]
    model: str
    model_version: str
    record: str  # models/production.json, byte for byte as it is committed
    message: str
    tag: str
    version_tag: str = ""  # GTO's <artifact>@v<semver>; made before `tag`
    project: str = ""  # the project's folder in the repository ("" at its top; lm/ for lm)
