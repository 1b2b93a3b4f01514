"""Stage `features@m`: each prepared split turned into model inputs once, as a DVC output, for
m and every model whose features are m's (the same frozen encoder section, data and rows).

ngram: hashed n-gram ids; encoder (full, LoRA): token ids; encoder (frozen): pooled
embeddings of the frozen encoder, the expensive part. The stage depends only on the spec
fields that shape the features, so a change to the head, the learning rate or the seed
reruns `train@m` in seconds without re-encoding. The cache's format is data.py's.
"""

from __future__ import annotations

from typing import Any

from reprogate.pipeline.context import Context, Result
from reprogate.specs.pipeline import Pipeline, augments
from reprogate.utils import paths

PER_MODEL = "trained"
# Models whose features are equal (specs/pipeline.features_source) share the first one's stage:
# mpnet's embeddings are encoded once for every head trained on them, not once per head.
SHARED = True
NUMERIC = True  # its outputs are floats: it reruns when params.yaml's numerics change


def dvc(p: Pipeline) -> dict[str, Any]:
    # The augmented rows, whenever the data spec makes them: one declaration serves every model,
    # and a model without augment: true encodes the same features from the same prepared data.
    augmented = [paths.AUGMENTED.parent.as_posix()] if augments(p) else []
    return {
        "deps": ["data/prepared", *augmented],
        # Only what shapes the features: a head, lr or seed change does not re-encode.
        "params": [{"specs/models/${key}.yaml": ["family", "data", "${item.code}"]}],
        "outs": ["data/features/${key}"],
    }


def run(ctx: Context) -> Result:
    from reprogate.data.features import featurize

    return Result(featurize(ctx.root, ctx.model, ctx.log))
