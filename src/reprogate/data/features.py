"""What stage `features@m` runs: each prepared split turned into model m's inputs once
(pipeline/stages/features.py declares it to DVC)."""

from __future__ import annotations

import time
from pathlib import Path

from reprogate import models
from reprogate.data.prepared import require_prepared, splits, texts, write_features
from reprogate.models.base import OnDevice
from reprogate.runtime.device import configure_mps_env, seed_everything, select_device
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from reprogate.utils import paths
from reprogate.utils.console import say


def featurize(root: Path, name: str, log=None) -> str:
    log = log or say
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
