"""Stage `tokenize@m`: data/corpus/ -> data/tokens/<m>/ (tokenizer.json, token ids, manifest).

The tokenizer is trained (BPE) or read off the corpus (char) here, once, and its time is not
counted in the training budget. The stage depends only on the corpus and the spec's
`causal_lm.tokenizer` section, so a change of model shape or learning rate reruns training
without re-tokenizing. Same corpus and spec -> byte-identical files (tests/integration/test_lm.py).
"""

from __future__ import annotations

from typing import Any

from reprogate.pipeline.context import Context, Result
from reprogate.specs.pipeline import Pipeline
from reprogate.utils import paths

PER_MODEL = "trained"


def dvc(p: Pipeline) -> dict[str, Any]:
    return {
        "deps": [str(paths.CORPUS)],
        "params": [{"specs/models/${key}.yaml": ["family", "data", "causal_lm.tokenizer"]}],
        "outs": ["data/tokens/${key}"],
    }


def run(ctx: Context) -> Result:
    from reprogate.lm.tokenize import summary, tokenize

    m = tokenize(ctx.root, ctx.model, ctx.log)
    return Result(summary(ctx.model, m), telemetry={"tokenize_s": m["seconds"]})
