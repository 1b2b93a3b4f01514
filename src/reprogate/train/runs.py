"""What every kind's training run shares, whatever its family: where the run's files are, its
code identity, each rank's device, and the number of processes it is launched as. A kind's setup
(train/run.py for a classifier, lm/training.py for a language model) builds on it; neither
imports the other."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from reprogate.records import code
from reprogate.runtime.device import rank_and_world
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from reprogate.utils import paths as project
from reprogate.utils.errors import UserError


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


def code_hash(spec: ModelSpec) -> str:
    """The train stage's code identity for the spec's family (code/train/<family>.json): what its
    modules mean, not their bytes, so the fingerprint changes when, and only when, DVC reruns
    training, and a comment never throws a finished run away (checkpoint.resume_point compares it)."""
    return code.current("train", spec.family).identity


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
