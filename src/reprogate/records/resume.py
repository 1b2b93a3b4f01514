"""results/<m>/resume.json (resume_check's complete record) and metrics/<m>/resume.json."""

from __future__ import annotations

from typing import Literal

from reprogate.records.base import Record


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
