"""results/<m>/eval.json, predictions/<m>/<set>.jsonl and metrics/<m>/eval.json (the headline)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from reprogate.records.base import Interval, ModelVersion, Record, Sha256
from reprogate.records.calibration import PolicyRecord

# The set model choices look at: its numbers are in train.json (validation_accuracy) and the
# complete record; the headline keeps the sets a model is judged on.
MODEL_CHOICE_SET = "validation"


SetUse = Literal["evaluate", "calibrate"]


class LabelledSet(Record):
    """validation and test, or a set of real utterances (kind real_utterance)."""

    kind: Literal["labelled", "real_utterance"]
    accuracy: float
    n: int | None = None
    use: SetUse | None = None  # calibrate: model choices may have looked at it; the gate skips it
    data_sha256: Sha256 | None = None
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
    data_sha256: Sha256 | None = None
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
    data_sha256: Sha256 | None = None


EvalSetRecord = Annotated[LabelledSet | OutOfScopeSet | ChallengeSet, Field(discriminator="kind")]


class Evaluation(Record):
    heldout: str = "test"
    device: str | None = None
    model_version: ModelVersion | None = None
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
    model_version: ModelVersion
    kind: str | None = None  # a challenge set's kind of query (unrelated, ambiguous, ...)


class SetMetrics(Record):
    """A labelled set's six numbers, an out-of-scope set's two, or a challenge set's one."""

    accuracy: float | None = None
    macro_f1: float | None = None
    ece: float | None = None  # after calibration
    nll: float | None = None
    coverage: float | None = None
    wrong_action_rate: float | None = None
    false_positive_action_rate: float | None = None
    action_rate: float | None = None  # challenge queries acted on


class EvalMetrics(Record):
    sets: dict[str, SetMetrics]

    @classmethod
    def of(cls, ev: Evaluation) -> EvalMetrics:
        sets = {}
        for name, s in ev.sets.items():
            if name == MODEL_CHOICE_SET:
                continue
            if isinstance(s, LabelledSet):
                sets[name] = SetMetrics(
                    accuracy=s.accuracy,
                    macro_f1=s.macro_f1,
                    ece=s.ece_after,
                    nll=s.nll,
                    coverage=s.coverage,
                    wrong_action_rate=s.wrong_action_rate,
                )
            elif isinstance(s, ChallengeSet):
                sets[name] = SetMetrics(action_rate=s.action_rate)
            else:
                sets[name] = SetMetrics(
                    coverage=s.coverage, false_positive_action_rate=s.false_positive_action_rate
                )
        return cls(sets=sets)
