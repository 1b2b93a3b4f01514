"""Stage `corpus`: a text spec's pinned files -> data/corpus/{train,validation}.txt.

Every file's sha256 is verified before it is decoded (the mirror and fetch rules of `prepare`),
decoded as UTF-8 (a byte that is not is an error naming the file and offset), canonicalised
as the spec states, joined in order, and split into train and validation by contiguous
stretches. With `split.kind: tail` and validation 0.1 this is nanoGPT's shakespeare_char split
exactly: train = text[:int(n * 0.9)], validation = the rest. Outputs are byte-identical for the
same spec and files.
"""

from __future__ import annotations

from typing import Any

from reprogate.pipeline.context import Context, Result
from reprogate.specs.pipeline import Pipeline, load_pipeline
from reprogate.utils import paths

PER_MODEL = None


def dvc(p: Pipeline) -> dict[str, Any]:
    return {
        "deps": [],
        "params": [{p.data: None}],
        "outs": [
            str(paths.CORPUS),
            {"results/data.json": {"cache": False}},
            {"metrics/data.json": {"cache": False}},
        ],
    }


def run(ctx: Context) -> Result:
    from reprogate.lm.corpus import build, summary

    return Result(summary(build(ctx.spec or ctx.root / load_pipeline(ctx.root).data, ctx.root)))
