"""Stage `features@m`: each prepared split turned into model inputs once, as a DVC output.

ngram: hashed n-gram ids; encoder (full, LoRA): token ids; encoder (frozen): pooled
embeddings of the frozen encoder, the expensive part. The stage depends only on the spec
fields that shape the features, so a change to the head, the learning rate or the seed
reruns `train@m` in seconds without re-encoding. The cache's format is data.py's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from reprogate import models
from reprogate.data.prepared import require_prepared, splits, texts, write_features
from reprogate.models.base import OnDevice
from reprogate.pipeline.context import Context, Result
from reprogate.runtime.device import configure_mps_env, seed_everything, select_device
from reprogate.specs import ModelSpec, Pipeline, load_spec
from reprogate.utils import paths

PER_MODEL = "trained"
NUMERIC = True  # its outputs are floats: it reruns when params.yaml's numerics change


def dvc(p: Pipeline) -> dict[str, Any]:
    return {
        "deps": ["data/prepared"],
        # Only what shapes the features: a head, lr or seed change does not re-encode.
        "params": [{"specs/models/${key}.yaml": ["family", "data", "${item.family}"]}],
        "outs": ["data/features/${key}"],
    }


def featurize(root: Path, name: str, log=None) -> str:
    log = log or Context(root).log
    started = time.perf_counter()
    spec_path = root / paths.model_spec(name)
    spec = load_spec(spec_path, ModelSpec)
    require_prepared(root, spec_path)
    configure_mps_env(spec)
    device = select_device(spec, spec_path)
    seed_everything(spec.seed, spec.threads, device)
    _, featurizer = models.build(spec, 2, root)
    if isinstance(featurizer, OnDevice):  # a frozen encoder loads onto it when first needed
        featurizer.device = device

    def encode(split: str):
        before = featurizer.truncated
        feats = featurizer.encode(texts(root, split))
        log(f"features: {name}/{split}: {len(feats)} rows")
        return feats, {"truncated": featurizer.truncated - before}

    entries = write_features(root, name, featurizer, splits(root, spec), encode)
    rows = sum(e["rows"] for e in entries.values())
    truncated = sum(e["truncated"] for e in entries.values())
    return (
        f"features: {name}: {rows} rows in {len(entries)} splits, {truncated} truncated, "
        f"{time.perf_counter() - started:.1f} s"
    )


def run(ctx: Context) -> Result:
    return Result(featurize(ctx.root, ctx.model, ctx.log))
