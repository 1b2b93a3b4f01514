"""Everything a training run is built from: its paths, its data and features, its fingerprint,
its length, and a seeded trainer (built as often as needed: `plan` measures a throwaway one).

The `train@m` stage, `reprogate plan`, the benchmarks and the tests all build runs here.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reprogate import models
from reprogate.data.prepared import gold_indices, load_train_data, rows, split_features
from reprogate.models.base import OnDevice, concat, predict_logits
from reprogate.records.base import write
from reprogate.records.train import Fingerprint, TrainRecord
from reprogate.runtime.device import (
    configure_mps_env,
    environment,
    rank_and_world,
    seed_everything,
    select_device,
)
from reprogate.specs.data import DataSpec
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec, training_hash
from reprogate.train.folder import export_trained
from reprogate.train.objectives import Classification, PairedClassification
from reprogate.train.trainer import Trainer, total_steps
from reprogate.utils import imports
from reprogate.utils import paths as project
from reprogate.utils.errors import UserError
from reprogate.utils.jsonl import read_jsonl


@dataclass
class Paths:
    """Where one run reads its spec and writes its checkpoints, model, metrics and plots."""

    name: str
    spec: Path
    run: Path
    model: Path
    metrics: Path
    plots: Path

    @classmethod
    def for_model(
        cls,
        root: Path,
        name: str,
        spec: Path | None = None,
        run: Path | None = None,
        work: Path | None = None,
    ) -> Paths:
        if work is not None:  # everything of this run in one folder (resume_check, tests)
            return cls(
                name,
                spec or root / project.model_spec(name),
                work,
                work / "model",
                work / "metrics",
                work / "plots",
            )
        return cls(
            name=name,
            spec=spec or root / project.model_spec(name),
            run=run or root / project.run_dir(name),
            model=root / project.model_dir(name),
            metrics=root / project.metrics_dir(name),
            plots=root / project.plots_dir(name),
        )


def code_hash() -> str:
    """The train stage's code identity (code/train.json): what its modules mean, not their
    bytes, so the fingerprint changes when, and only when, DVC reruns training, and a comment
    never throws a finished run away (checkpoint.resume_point compares it)."""
    return imports.stage_identity("train")[0]


def fingerprint(spec: ModelSpec, data, device, featurizer) -> dict[str, Any]:
    encoder = {"encoder_sha256": featurizer.encoder_sha256} if spec.family == "encoder" else {}
    return {
        **encoder,
        "spec_hash": training_hash(spec),
        "data_hash": data.data_hash,
        "labels_hash": hashlib.sha256(json.dumps(data.labels).encode()).hexdigest(),
        "code_hash": code_hash(),
        "environment": environment(device),
    }


def rank_device(device, spec: ModelSpec, spec_path: Path):
    """This rank's device: its own GPU on CUDA (LOCAL_RANK), the CPU otherwise."""
    if device.type == "mps":
        raise UserError(
            f"{spec_path}: field 'processes' is {spec.processes}, but device 'auto' chose mps, which "
            "has no multi-process backend in PyTorch; use processes: 1, or device: cpu."
        )
    if device.type != "cuda":
        return device
    if torch.cuda.device_count() < spec.processes:
        raise UserError(
            f"{spec_path}: field 'processes' is {spec.processes}, but this machine has "
            f"{torch.cuda.device_count()} CUDA device(s) and each process needs its own; use processes: "
            f"{torch.cuda.device_count()} or fewer."
        )
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    return torch.device("cuda", local)


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
    return checked_total_steps(spec, spec_path, sum(len(read_jsonl(p)) for p in parts))


class Setup:
    """Everything needed to build a fresh, seeded trainer (possibly more than once)."""

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
        paired = self.spec.encoder is not None and self.spec.encoder.contrastive is not None
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


def check_world(paths: Paths, spec: ModelSpec, world: int) -> None:
    """A launch with another number of processes than the spec's is refused (any family)."""
    if world != spec.processes:
        raise UserError(
            f"{paths.spec}: field 'processes' is {spec.processes}, but this run was launched "
            f"as {world} processes (WORLD_SIZE={world}); launch it with `reprogate stage train "
            f"{paths.name}`, which starts the spec's number of processes, or set processes: {world}."
        )


def processes_to_launch(paths: Paths) -> int:
    """The spec's number of processes when this process must start them (not itself a rank)."""
    n = load_spec(paths.spec, ModelSpec).processes
    return n if n > 1 and rank_and_world()[1] == 1 else 0


def validation_accuracy(setup: Setup, trainer: Trainer) -> float:
    gold = torch.from_numpy(gold_indices(rows(setup.root, "validation"), setup.data.labels))
    pred = predict_logits(trainer.model, setup.featurizer, setup.split("validation"), setup.device).argmax(-1)
    return float((pred == gold).float().mean())
