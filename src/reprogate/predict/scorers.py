"""The scorer of a model folder, by the family its config.json names (its declaration's
`scorer`): an exported model is answered by its runtime (export/scorer.py), the others by torch
(folder/scorer.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reprogate.folder.files import damaged
from reprogate.folder.scorer import Scorer
from reprogate.records.base import load
from reprogate.records.train import ModelConfig
from reprogate.specs.family import family
from reprogate.utils import paths


def open_scorer(
    root: Path,
    name: str,
    model_dir: Path | None = None,
    device: str | None = None,
    members_dir: Path | None = None,
) -> Any:  # a Scorer, or its family's scorer (an ExportScorer)
    folder = model_dir or root / paths.model_dir(name)
    config = folder / "config.json"
    named = load(config, ModelConfig, damaged(folder)).family if config.is_file() else None
    scorer = family(named).part("scorer") if named else Scorer
    return scorer(root, name, model_dir or folder, device=device, members_dir=members_dir)
