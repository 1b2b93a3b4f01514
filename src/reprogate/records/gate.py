"""results/gate.json (the gate's decision) and metrics/gate.json, its headline."""

from __future__ import annotations

from typing import Any, Literal

from reprogate.records.base import ModelVersion, Record


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
    model_version: ModelVersion | None
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


class GateMetrics(Record):
    """metrics/gate.json: whether a candidate passed and which one is chosen (each candidate's
    verdict and numbers are its own row, CandidateRow)."""

    passed: bool
    chosen: str | None

    @classmethod
    def of(cls, d: Decision) -> GateMetrics:
        return cls(passed=d.passed, chosen=d.chosen)


class CandidateRow(Record):
    """metrics/candidates/<m>.json: one row per candidate in `dvc metrics show`, the same few
    columns for each: the values the gate judged (the kind's headline rules, under short names)
    and the verdict. Everything else is in results/ and `dvc metrics show results/<m>/eval.json`."""

    passed: bool

    @classmethod
    def of(cls, c: Candidate, columns: tuple[tuple[str, str], ...]) -> CandidateRow:
        values = {r.rule: r.value for r in c.rules}
        numbers = {
            col: v if isinstance(v := values.get(rule), int | float) and not isinstance(v, bool) else None
            for rule, col in columns
        }
        return cls(passed=c.passed, **numbers)
