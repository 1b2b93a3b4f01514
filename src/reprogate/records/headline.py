"""The DVC metric files: the headline numbers of each stage's record, and nothing else.

`dvc metrics show` prints one column per number it finds, and `dvc metrics diff` one line per
number that moved; with every bootstrap bound, hash and per-intent score declared as a metric,
one learning-rate change printed hundreds of lines. So metrics/ holds what a person compares
across commits, and the complete records (results/, records.py) hold the rest. Each headline is
derived from its record here, by the stage that writes both, so the two never disagree.

| file                    | model         | derived from                  |
| ----------------------- | ------------- | ----------------------------- |
| metrics/data.json       | DataMetrics   | results/data.json (DataRecord) |
| metrics/<m>/eval.json   | EvalMetrics   | results/<m>/eval.json (Evaluation) |
| metrics/<m>/resume.json | ResumeMetrics | results/<m>/resume.json (ResumeRecord) |
| metrics/gate.json       | GateMetrics   | results/gate.json (Decision)  |
metrics/<m>/train.json is its own record (TrainRecord, CombineRecord): it is headline already.
"""

from __future__ import annotations

from reprogate.records import (
    ChallengeSet,
    DataRecord,
    Decision,
    Evaluation,
    LabelledSet,
    Record,
    ResumeRecord,
)

# The set model choices look at: its numbers are in train.json (validation_accuracy) and the
# complete record; the headline keeps the sets a model is judged on.
MODEL_CHOICE_SET = "validation"


class DataMetrics(Record):
    dataset: str
    labels: int
    rows: dict[str, int]
    dropped: dict[str, int]  # split -> rows dropped for any reason (by reason: results/data.json)

    @classmethod
    def of(cls, r: DataRecord) -> DataMetrics:
        return cls(
            dataset=r.dataset,
            labels=r.labels,
            rows=r.rows,
            dropped={split: sum(reasons.values()) for split, reasons in r.dropped.items()},
        )


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


class ResumeMetrics(Record):
    passed: bool | None
    failed_fields: int  # of the fields compared (model, optimizer, RNG, ...): 0 when it passed
    engine: str | None = None
    killed_rank: int | None = None
    restored_step: int | None = None
    restarts: int | None = None
    cause: str | None = None

    @classmethod
    def of(cls, r: ResumeRecord) -> ResumeMetrics:
        failed = sum(f.verdict == "fail" for f in (r.fields or {}).values())
        return cls(
            passed=r.passed,
            failed_fields=failed,
            engine=r.engine,
            killed_rank=r.killed_rank,
            restored_step=r.restored_step,
            restarts=r.restarts,
            cause=r.cause,
        )


class GateMetrics(Record):
    passed: bool
    chosen: str | None
    candidates: dict[str, bool]  # candidate -> passed every rule

    @classmethod
    def of(cls, d: Decision) -> GateMetrics:
        return cls(
            passed=d.passed, chosen=d.chosen, candidates={n: c.passed for n, c in d.candidates.items()}
        )
