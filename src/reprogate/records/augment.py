"""metrics/augment.json: what stage `augment` wrote (data/augment.py)."""

from __future__ import annotations

from reprogate.records.base import Record


class AugmentRecord(Record):
    source_rows: int  # train rows read
    copies: int
    seed: int
    rows: int = 0  # variants written to data/augmented/train.jsonl
    dropped_unchanged: int = 0  # no rule applied, or the same text once normalised
    dropped_seen: int = 0  # equal to a prepared row (train, held-out, evaluation) or an earlier variant
    # and, per rule, how many written variants it changed (typos, casing, ...): extra fields
