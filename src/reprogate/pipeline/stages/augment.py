"""Stage `augment`: readable, seeded variants of the train partition (data/augment.py has the
rules), written once as data/augmented/train.jsonl for the model specs with augment: true.

Declared only when the data spec has an `augment` section; built from the train partition alone,
so no evaluation row can reach training through it.
"""

from __future__ import annotations

from typing import Any

from reprogate.pipeline.context import Context, Result
from reprogate.specs.data import DataSpec
from reprogate.specs.loader import load_spec
from reprogate.specs.pipeline import Pipeline, augments, load_pipeline

PER_MODEL = None


def dvc(p: Pipeline) -> dict[str, Any] | None:
    if not augments(p):
        return None
    return {
        "deps": ["data/prepared"],
        "params": [{p.data: ["augment", "normalization"]}],
        "outs": ["data/augmented", {"metrics/augment.json": {"cache": False}}],
    }


def run(ctx: Context) -> Result:
    from reprogate.data.augment import augment, summary
    from reprogate.records.augment import AugmentRecord
    from reprogate.records.base import write

    data = load_spec(ctx.root / load_pipeline(ctx.root).data, DataSpec)
    if data.augment is None:
        return Result(f"augment: {load_pipeline(ctx.root).data} declares no augment section; nothing to do")
    record = AugmentRecord.model_validate(augment(ctx.root, data))
    write(ctx.root / "metrics/augment.json", record)
    return Result(summary(record.model_dump()), record)
