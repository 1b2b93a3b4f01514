"""Everything a classifier's training run is built from: its data and features, its fingerprint,
its length, and a seeded trainer (built as often as needed: `plan` measures a throwaway one).
What every kind's run shares (its paths, code identity, devices, world) is train/runs.py.

The `train@m` stage, `reprogate plan`, the benchmarks and the tests all build runs here.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import torch

from reprogate import models
from reprogate.data.prepared import gold_indices, load_train_data, rows, split_features
from reprogate.folder.files import export_trained
from reprogate.models.base import OnDevice, concat, predict_logits
from reprogate.records.base import write
from reprogate.records.train import Fingerprint, TrainRecord
from reprogate.runtime.device import (
    configure_mps_env,
    environment,
    seed_everything,
    select_device,
)
from reprogate.specs.data import DataSpec
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec, training_hash
from reprogate.train.objectives import Classification, PairedClassification
from reprogate.train.runs import Paths, check_world, code_hash, rank_device
from reprogate.train.trainer import Trainer, total_steps
from reprogate.utils import paths as project
from reprogate.utils.errors import UserError
from reprogate.utils.jsonl import read_jsonl


def fingerprint(spec: ModelSpec, data, device, featurizer) -> dict[str, Any]:
    encoder = spec.family_def.fingerprint(featurizer)
    return {
        **encoder,
        "spec_hash": training_hash(spec),
        "data_hash": data.data_hash,
        "labels_hash": hashlib.sha256(json.dumps(data.labels).encode()).hexdigest(),
        "code_hash": code_hash(spec),
        "environment": environment(device),
    }


def checked_total_steps(spec: ModelSpec, spec_path: Path, n_examples: int) -> int:
    """The run's optimizer updates, once the number of examples is known; a checkpoint interval
    longer than the run is refused (no checkpoint would ever be written)."""
    steps = total_steps(spec, n_examples)
    if spec.checkpoint.every_steps > steps:
        raise UserError(
            f"{spec_path}: field 'checkpoint.every_steps' is {spec.checkpoint.every_steps}, but "
            f"this run has only {steps} steps ({spec.epochs} epochs of {n_examples} examples); "
            f"use at most {steps}."
        )
    return steps


def prepared_steps(root: Path, spec: ModelSpec, spec_path: Path) -> int | None:
    """What `checked_total_steps` will say when training starts, said at `validate` time from
    the prepared data's row counts, when data/prepared holds the spec's data (None otherwise)."""
    if not spec.trained or spec.steps is not None:
        return None
    prepared = root / project.PREPARED
    data_spec = root / spec.data
    if not (prepared / "labels.json").is_file() or not data_spec.is_file():
        return None
    if json.loads((prepared / "labels.json").read_text()) != load_spec(data_spec, DataSpec).labels:
        return None  # prepared from another data spec
    names = ["train"] + (["negatives"] if spec.head.out_of_scope_class else [])
    parts = [prepared / f"{n}.jsonl" for n in names] + ([root / project.AUGMENTED] if spec.augment else [])
    if not all(p.is_file() for p in parts):
        return None  # prepared before the data spec had negatives: train says to rerun prepare
    added = spec.family_def.part("setup").added_rows(root, spec)
    return checked_total_steps(spec, spec_path, sum(len(read_jsonl(p)) for p in parts) + added)


class Setup:
    """Everything needed to build a fresh, seeded trainer (possibly more than once)."""

    record = TrainRecord  # metrics/<m>/train.json

    def __init__(self, root: Path, paths: Paths):
        self.root, self.paths = root, paths
        self.spec = load_spec(paths.spec, ModelSpec)
        configure_mps_env(self.spec)
        self.device = select_device(self.spec, paths.spec)
        if self.spec.processes > 1:
            self.device = rank_device(self.device, self.spec, paths.spec)
        self.data = load_train_data(root, self.spec, paths.spec)
        t0 = time.perf_counter()
        _, self.featurizer = self._build()
        if isinstance(self.featurizer, OnDevice):  # a frozen encoder loads onto it when first needed
            self.featurizer.device = self.device
        self.feats = self.split("train")
        if self.spec.augment:  # in load_train_data's order: train, augmented, negatives
            self.feats = concat(self.feats, self.split("augmented"))
        if self.spec.head.out_of_scope_class:
            self.feats = concat(self.feats, self.split("negatives"))
        self.encode_s = time.perf_counter() - t0
        self.total_steps = checked_total_steps(self.spec, paths.spec, len(self.feats))
        self.fingerprint = fingerprint(self.spec, self.data, self.device, self.featurizer)

    @classmethod
    def added_rows(cls, root: Path, spec: ModelSpec) -> int:
        """Rows its run trains on beyond the prepared splits (composed ones): `validate` counts them."""
        return 0

    def check_world(self, world: int) -> None:
        check_world(self.paths, self.spec, world)

    def split(self, name: str):
        """Features of a prepared split: from features@m when it matches, else encoded now."""
        return split_features(self.root, self.paths.name, self.featurizer, name)

    def _build(self):
        seed_everything(self.spec.seed, self.spec.threads, self.device)
        return models.build(self.spec, len(self.data.labels), self.root)

    def trainer(self):
        model, _ = self._build()
        labels = [e.label for e in self.data.examples]
        # A family whose section asks for sentence pairs (encoder.contrastive) trains with them.
        paired = getattr(self.spec.config, "contrastive", None) is not None
        objective = (PairedClassification if paired else Classification)(
            self.spec, self.featurizer, self.feats, labels, len(self.data.labels), self.device
        )
        return Trainer(self.spec, model, objective, self.device, self.total_steps)

    def callbacks(self) -> tuple:
        """The kind's own trainer callbacks, run before the checkpoint of each update."""
        return ()

    def finish(self, trainer: Trainer, fingerprint: Fingerprint) -> dict[str, Any]:
        """After the fit (rank 0): the model folder and metrics/<m>/train.json, the record as a dict."""
        val_acc = validation_accuracy(self, trainer)
        export_trained(
            self.paths.model, self.spec, trainer.model, self.featurizer, self.data.labels, fingerprint
        )
        p = trainer.progress
        record = TrainRecord(
            steps=p.global_step,
            epochs=p.epoch,
            examples=len(self.feats),
            final_loss=p.losses[-1] if p.losses else None,
            validation_accuracy=round(val_acc, 4),
            truncated_texts=self.featurizer.truncated,
        )
        write(self.paths.metrics / "train.json", record)
        return record.model_dump(mode="json", exclude_unset=True)

    def telemetry(self, seen: int, loop_s: float) -> dict[str, Any]:
        """The kind's own run-log fields beyond what every run reports."""
        return {}


def validation_accuracy(setup: Setup, trainer: Trainer) -> float:
    gold = torch.from_numpy(gold_indices(rows(setup.root, "validation"), setup.data.labels))
    pred = predict_logits(trainer.model, setup.featurizer, setup.split("validation"), setup.device).argmax(-1)
    return float((pred == gold).float().mean())
