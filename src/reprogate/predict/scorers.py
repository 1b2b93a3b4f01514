"""The scorer of a model folder, by the family its config.json names: an exported model is
answered by its runtime (export/scorer.py), every other by torch (train/folder.py)."""

from __future__ import annotations

from pathlib import Path

from reprogate.export.scorer import ExportScorer
from reprogate.records.base import load
from reprogate.records.train import ModelConfig
from reprogate.train.folder import Scorer, damaged
from reprogate.utils import paths


def open_scorer(
    root: Path,
    name: str,
    model_dir: Path | None = None,
    device: str | None = None,
    members_dir: Path | None = None,
) -> Scorer | ExportScorer:
    folder = model_dir or root / paths.model_dir(name)
    config = folder / "config.json"
    if config.is_file() and load(config, ModelConfig, damaged(folder)).family == "export":
        return ExportScorer(root, name, folder, device)
    return Scorer(root, name, model_dir, device=device, members_dir=members_dir)
