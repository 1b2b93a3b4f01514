"""results/data.json (prepare's complete record) and metrics/data.json, its headline."""

from __future__ import annotations

from reprogate.records.base import Record


class DataRecord(Record):
    dataset: str
    labels: int
    rows: dict[str, int]
    dropped: dict[str, dict[str, int]]
    audit: dict[str, dict[str, int]]
    sha256: dict[str, str]  # split -> sha256 of data/prepared/<split>.jsonl
    raw_sha256: dict[str, str]


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
