"""Stage `features@m`: each prepared split turned into model inputs once, as a DVC output.

ngram: hashed n-gram ids; encoder (full, LoRA): token ids; encoder (frozen): pooled
embeddings of the frozen encoder, the expensive part. The stage depends only on the spec
fields that shape the features, so a change to the head, the learning rate or the seed
reruns `train@m` in seconds without re-encoding. Readers use a cached split only when its
featurizer key and the sha256 of its prepared source both match; otherwise they encode.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from reprogate.atomic import replace_dir
from reprogate.errors import UserError
from reprogate.hashing import sha256_file
from reprogate.models import feature_key
from reprogate.specs import ModelSpec, load_spec

PREPARED = Path("data/prepared")
FEATURES = Path("data/features")
# Fields of a model spec that change its features (DVC params of the stage).
SPEC_FIELDS = ("family", "data", "ngram", "encoder", "head.out_of_scope_class")


def require_prepared(root: Path, spec_path: Path) -> Path:
    """data/prepared/, or the error that says which stage to run first."""
    prepared = root / PREPARED
    if not (prepared / "labels.json").is_file():
        raise UserError(
            f"{spec_path}: no prepared data at {prepared}; run `dvc repro prepare` (or "
            "`reprogate stage prepare`) first."
        )
    return prepared


def prepared_file(root: Path, split: str) -> Path:
    """data/prepared/<split>.jsonl, or the error that says the prepared data is older than the
    data spec (a split or evaluation set declared since, or a file removed)."""
    path = root / PREPARED / f"{split}.jsonl"
    if not path.is_file():
        raise UserError(
            f"{path} does not exist: the prepared data does not have the split '{split}' (declared in "
            "the data spec after `prepare` ran, or the file was removed). Run `dvc repro prepare` "
            "(`dvc repro` reruns what depends on it)."
        )
    return path


def splits(root: Path, spec: ModelSpec) -> list[str]:
    names = sorted(p.stem for p in (root / PREPARED).glob("*.jsonl"))
    return [n for n in names if n != "negatives" or spec.head.out_of_scope_class]


def texts(root: Path, split: str) -> list[str]:
    with open(prepared_file(root, split), encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def split_features(root: Path, name: str, featurizer, split: str):
    """Cached features of a prepared split when they match; freshly encoded otherwise."""
    folder = root / FEATURES / name
    manifest = folder / "manifest.json"
    source = prepared_file(root, split)
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        entry = m["splits"].get(split)
        if m["key"] == feature_key(featurizer) and entry and entry["source_sha256"] == sha256_file(source):
            featurizer.truncated = getattr(featurizer, "truncated", 0) + entry.get("truncated", 0)
            return featurizer.from_tensors(load_file(str(folder / f"{split}.safetensors")))
    return featurizer.encode(texts(root, split))


def concat(a, b):
    return torch.cat([a, b]) if torch.is_tensor(a) else a + b


def write(root: Path, name: str, featurizer, names: list[str], produce) -> dict[str, dict]:
    """Write data/features/<name>/ from `produce(split) -> (features, extra manifest fields)`:
    built in a temporary sibling folder and swapped in whole, manifest last."""
    out = root / FEATURES / name
    entries = {}
    with replace_dir(out) as tmp:
        for split in names:
            feats, extra = produce(split)
            save_file(featurizer.to_tensors(feats), str(tmp / f"{split}.safetensors"))
            entries[split] = {
                "rows": len(feats),
                "source_sha256": sha256_file(root / PREPARED / f"{split}.jsonl"),
                **extra,
            }
        manifest = {"key": feature_key(featurizer), "featurizer": featurizer.key(), "splits": entries}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return entries


def run(root: Path, name: str) -> str:
    from reprogate import models
    from reprogate.runtime import configure_mps_env, seed_everything, select_device

    started = time.perf_counter()
    spec_path = root / "specs" / "models" / f"{name}.yaml"
    spec = load_spec(spec_path, ModelSpec)
    require_prepared(root, spec_path)
    configure_mps_env(spec)
    device = select_device(spec, spec_path)
    seed_everything(spec.seed, spec.threads, device)
    _, featurizer = models.build(spec, 2, root)
    if hasattr(featurizer, "device"):  # a frozen encoder loads onto it when first needed
        featurizer.device = device

    def encode(split: str):
        before = getattr(featurizer, "truncated", 0)
        feats = featurizer.encode(texts(root, split))
        print(f"features: {name}/{split}: {len(feats)} rows", file=sys.stderr, flush=True)
        return feats, {"truncated": getattr(featurizer, "truncated", 0) - before}

    entries = write(root, name, featurizer, splits(root, spec), encode)
    rows = sum(e["rows"] for e in entries.values())
    truncated = sum(e["truncated"] for e in entries.values())
    return (
        f"features: {name}: {rows} rows in {len(entries)} splits, {truncated} truncated, "
        f"{time.perf_counter() - started:.1f} s"
    )
