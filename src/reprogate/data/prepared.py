"""Data access for every stage after `prepare`: prepared splits, the feature cache, train data.

data/prepared/<split>.jsonl  what `prepare` wrote (id, text, label), one file per split
data/features/<m>/           each split turned into model m's inputs once (`features@m`), with a
                             manifest: the featurizer key and each source split's sha256; models
                             whose features are equal read one model's (specs/pipeline.py)
Readers use a cached split only when its featurizer key and the sha256 of its prepared source
both match; otherwise they encode the texts again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.torch import load_file, save_file

from reprogate.models.base import Featurizer, feature_key
from reprogate.specs.base import OOS_LABEL
from reprogate.specs.data import DataSpec
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from reprogate.specs.pipeline import features_name
from reprogate.utils import paths
from reprogate.utils.atomic import replace_dir
from reprogate.utils.errors import UserError
from reprogate.utils.hashing import sha256_file
from reprogate.utils.jsonl import read_jsonl


def require_prepared(root: Path, spec_path: Path) -> Path:
    """data/prepared/, or the error that says which stage to run first."""
    prepared = root / paths.PREPARED
    if not (prepared / "labels.json").is_file():
        raise UserError(
            f"{spec_path}: no prepared data at {prepared}; run `dvc repro prepare` (or "
            "`reprogate stage prepare`) first."
        )
    return prepared


def prepared_file(root: Path, split: str) -> Path:
    """data/prepared/<split>.jsonl, or the error that says the prepared data is older than the
    data spec (a split or evaluation set declared since, or a file removed)."""
    path = root / paths.prepared_split(split)
    if not path.is_file():
        raise UserError(
            f"{path} does not exist: the prepared data does not have the split '{split}' (declared in "
            "the data spec after `prepare` ran, or the file was removed). Run `dvc repro prepare` "
            "(`dvc repro` reruns what depends on it)."
        )
    return path


def augmented_file(root: Path, spec_path: Path) -> Path:
    """data/augmented/train.jsonl, or the error that says which stage writes it."""
    path = root / paths.AUGMENTED
    if not path.is_file():
        raise UserError(
            f"{spec_path}: augment is true, but {path} does not exist. Give the data spec an `augment` "
            "section and run `dvc repro augment` (`reprogate stage augment`)."
        )
    return path


def rows(root: Path, split: str) -> list[dict]:
    return read_jsonl(prepared_file(root, split))


def texts(root: Path, split: str) -> list[str]:
    return [r["text"] for r in rows(root, split)]


def gold_indices(split_rows: list[dict], labels: list[str]) -> np.ndarray:
    index = {lbl: i for i, lbl in enumerate(labels)}
    return np.array([index[r["label"]] for r in split_rows])


def splits(root: Path, spec: ModelSpec) -> list[str]:
    """The prepared splits a model's features cover (the negatives only with an out-of-scope class)."""
    names = sorted(p.stem for p in (root / paths.PREPARED).glob("*.jsonl"))
    return [n for n in names if n != "negatives" or spec.head.out_of_scope_class] + (
        ["augmented"] if spec.augment else []
    )


def split_features(root: Path, name: str, featurizer: Featurizer, split: str):
    """Cached features of a prepared split when they match; freshly encoded otherwise."""
    folder = root / paths.features_dir(features_name(root, name))
    manifest = folder / "manifest.json"
    source = prepared_file(root, split)
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        entry = m["splits"].get(split)
        if m["key"] == feature_key(featurizer) and entry and entry["source_sha256"] == sha256_file(source):
            featurizer.truncated += entry.get("truncated", 0)
            return featurizer.from_tensors(load_file(str(folder / f"{split}.safetensors")))
    return featurizer.encode(texts(root, split))


def write_features(
    root: Path, name: str, featurizer: Featurizer, names: list[str], produce
) -> dict[str, dict]:
    """Write data/features/<name>/ from `produce(split) -> (features, extra manifest fields)`:
    built in a temporary sibling folder and swapped in whole, manifest last."""
    out = root / paths.features_dir(name)
    entries = {}
    with replace_dir(out) as tmp:
        for split in names:
            feats, extra = produce(split)
            save_file(featurizer.to_tensors(feats), str(tmp / f"{split}.safetensors"))
            entries[split] = {
                "rows": len(feats),
                "source_sha256": sha256_file(root / paths.prepared_split(split)),
                **extra,
            }
        manifest = {"key": feature_key(featurizer), "featurizer": featurizer.key(), "splits": entries}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return entries


@dataclass
class Example:
    text: str
    label: int


@dataclass
class TrainData:
    examples: list[Example]
    labels: list[str]  # output classes, in head order (vocabulary, then out_of_scope if used)
    data_hash: str


def load_train_data(root: Path, spec: ModelSpec, spec_path: Path) -> TrainData:
    """The train partition (and the negatives, as out of scope, for an out-of-scope class)."""
    prepared = require_prepared(root, spec_path)
    labels = json.loads((prepared / "labels.json").read_text())
    declared = load_spec(root / spec.data, DataSpec).labels
    if labels != declared:
        raise UserError(
            f"{prepared}/labels.json differs from the labels of {spec.data}: the prepared data is "
            "stale. Run `dvc repro prepare`."
        )
    files = [prepared / "labels.json", prepared / "train.jsonl"]
    index = {lbl: i for i, lbl in enumerate(labels)}
    examples = [Example(r["text"], index[r["label"]]) for r in read_jsonl(prepared / "train.jsonl")]
    if spec.augment:
        files.append(augmented_file(root, spec_path))
        examples += [Example(r["text"], index[r["label"]]) for r in read_jsonl(files[-1])]
    out = list(labels)
    if spec.head.out_of_scope_class:
        neg = prepared / "negatives.jsonl"
        if not neg.is_file():
            raise UserError(
                f"{spec_path}: head.out_of_scope_class is true, but {prepared} has no negatives.jsonl: "
                f"it was prepared before {spec.data} declared negatives. Run `dvc repro prepare`."
            )
        files.append(neg)
        examples += [Example(r["text"], len(labels)) for r in read_jsonl(neg)]
        out.append(OOS_LABEL)
    data_hash = hashlib.sha256("".join(sha256_file(f) for f in files).encode()).hexdigest()
    return TrainData(examples, out, data_hash)
