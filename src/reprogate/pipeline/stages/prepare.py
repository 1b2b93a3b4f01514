"""Stage `prepare`: pinned raw files -> audited, split, canonical JSONL under data/prepared/.

Order matters: verify every sha256 before parsing anything, fail on any label outside the
vocabulary before writing anything, and count every row that is dropped, by reason.
Outputs are byte-identical for the same spec and raw files.
"""

from __future__ import annotations

from typing import Any

from reprogate.pipeline.context import Context, Result
from reprogate.specs.pipeline import Pipeline, load_pipeline

PER_MODEL = None


def dvc(p: Pipeline) -> dict[str, Any]:
    return {
        "deps": [],
        "params": [{p.data: None}],
        "outs": [
            "data/prepared",
            {"results/data.json": {"cache": False}},
            {"metrics/data.json": {"cache": False}},
        ],
    }


def run(ctx: Context) -> Result:
    from reprogate.data.prepare import prepare, summary

    return Result(summary(prepare(ctx.spec or ctx.root / load_pipeline(ctx.root).data, ctx.root)))
