"""What every pipeline stage takes, returns and declares to DVC.

A stage is one module under stages/ with `PER_MODEL`, `dvc(pipeline)` and `run(context)`:
- NUMERIC (optional): True when its outputs are floats, so params.yaml's numerics is its param;
- PINNED (optional, default True): False for a stage that computes no float (stage `code`), so
  the runner does not check the numeric pin, which would import torch for it;
- PER_MODEL: None for a stage of the whole pipeline, else which models it runs for ("all",
  "trained", or "built": those whose family this stage builds), one DVC `foreach` item each;
- dvc(p): its data dependencies, params, outs, metrics and plots (`reprogate compile` adds the
  command and its code dependencies, derived from its imports), or None when no model needs it;
- run(ctx): does the work and returns a Result; a user mistake is a UserError.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from reprogate.records.base import Record
from reprogate.utils.console import say

PerModel = Literal["all", "trained", "built"] | None


def runs_for(stage: str, which: PerModel, spec: Any) -> bool:
    """Whether a stage of PER_MODEL `which` runs for a model of this spec: "all" models, the
    "trained" ones, or those "built" by this stage (combine, export)."""
    if which == "all":
        return True
    if which == "trained":  # ensembles are combined and exports compiled, not trained
        return spec.trained
    return which == "built" and spec.family_def.built_by == stage


def trained_families(models: dict[str, Any]) -> list[Any]:
    """The families of the trained models among `models` (spec by name), each once, in order:
    what a per-model stage's one DVC template must cover."""
    found = {spec.family_def.name: spec.family_def for spec in models.values() if spec.trained}
    return list(found.values())


def union(groups: Any) -> list[Any]:
    """The members of `groups` (iterables), each once, in the order first met."""
    out: list[Any] = []
    for group in groups:
        out += [g for g in group if g not in out]
    return out


@dataclass(frozen=True)
class Context:
    """`reprogate stage NAME [MODEL] [--spec ...]`, as every stage receives it."""

    root: Path
    model: str | None = None  # the foreach item; None for the stages of the whole pipeline
    spec: Path | None = None  # another spec file than the stage's default (resume_check's runs)
    run_dir: Path | None = None  # train: checkpoints elsewhere than runs/<m>/
    work_dir: Path | None = None  # train: everything of this run in one folder
    skip_plan: bool = False  # train: no measured projection before training
    pipeline: str = "default"  # gate: which of params.yaml's pipelines it judges (or experiments)
    log: Callable[[str], None] = field(default=say)


@dataclass(frozen=True)
class Result:
    summary: str  # the one line the stage ends with ("" from training ranks other than 0)
    record: Record | None = None  # what it wrote, as its readers read it
    # What the run measured about itself beyond wall time and peak memory (throughput, device,
    # the step it resumed from): its run-log line, never a tracked file (see runlog.py).
    telemetry: dict[str, Any] = field(default_factory=dict)
