"""The scorer of a model folder, by the family its config.json names (its declaration's
`scorer`): an exported model is answered by its runtime (export/scorer.py), the others by torch
(folder/scorer.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reprogate.folder.manifest import Files
from reprogate.folder.scorer import Scorer
from reprogate.records.train import ModelConfig
from reprogate.specs.family import family
from reprogate.utils import paths


def open_scorer(
    root: Path,
    name: str,
    model_dir: Path | None = None,
    device: str | None = None,
    members_dir: Path | None = None,
    files: Files | None = None,
    members: dict[str, Files] | None = None,
) -> Any:  # a Scorer, or its family's scorer (an ExportScorer)
    """The folder's scorer, from `files` (and an ensemble's `members`) as already read and
    verified (folder/manifest.py), or read once here."""
    folder = model_dir or root / paths.model_dir(name)
    files = files or Files.read(folder)
    named = files.record("config.json", ModelConfig).family if files.has("config.json") else None
    scorer = family(named).part("scorer") if named else Scorer
    return scorer(root, name, folder, device=device, members_dir=members_dir, files=files, members=members)
