"""The model folder, models/<m>/: written by train and combine, read by everything that scores
(folder/scorer.py opens a classifier's; lm/training.py a language model's).

model.safetensors   the trained weights (a frozen encoder's head only: the encoder is named
                    by its sha256 in the featurizer key, and checked when loaded)
config.json         family, outputs, featurizer key, the spec (records.ModelConfig)
labels.json         the output classes, in head order
fingerprint.json    where it came from (records.Fingerprint)
assets/             tokenizer and encoder config, the n-gram hashing config, an ensemble's
                    members and neighbour memory
calibration.json    calibrate@m's, beside them (records.CalibrationRecord)
Export and load sit side by side so that the two cannot drift apart.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch
from pydantic import ValidationError
from safetensors.torch import save_file

from reprogate.folder.manifest import Files, damaged
from reprogate.records.base import write
from reprogate.records.calibration import CalibrationRecord
from reprogate.records.train import Fingerprint, ModelConfig
from reprogate.specs.model import ModelSpec
from reprogate.utils import paths
from reprogate.utils.errors import UserError, first_problem, read_json


def clear(out: Path) -> Path:
    """models/<m>/ without the files a training run writes (calibration.json stays), and an
    empty assets/ to fill."""
    out.mkdir(parents=True, exist_ok=True)
    for name in paths.TRAIN_FILES:
        old = out / name
        if old.is_dir():
            shutil.rmtree(old)
        elif old.exists():
            old.unlink()
    (out / "assets").mkdir()
    return out / "assets"


def write_folder(
    out: Path, model: torch.nn.Module, config: ModelConfig, labels: list[str] | None, fingerprint: Fingerprint
) -> None:
    """The folder's weights, config and fingerprint; labels.json for a classifier (None: a
    language model, whose vocabulary is its tokenizer)."""
    state = model.state_dict()
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(out / "model.safetensors"))
    write(out / "config.json", config)
    if labels is not None:
        (out / "labels.json").write_text(json.dumps(labels, indent=1, ensure_ascii=False) + "\n")
    write(out / "fingerprint.json", fingerprint)


def export_trained(
    out: Path,
    spec: ModelSpec,
    model: torch.nn.Module,
    featurizer,
    labels: list[str],
    fingerprint: Fingerprint,
) -> None:
    """models/<m>/ of a trained model. calibration.json beside it is calibrate@m's."""
    assets = clear(out)
    write_assets = spec.family_def.part("assets")
    if write_assets is None:
        (assets / "featurizer.json").write_text(json.dumps(featurizer.key(), indent=2) + "\n")
    else:
        write_assets(assets, spec, model, featurizer)
    config = ModelConfig(
        family=spec.family, n_out=len(labels), featurizer=featurizer.key(), spec=spec.model_dump(mode="json")
    )
    write_folder(out, model, config, labels, fingerprint)


def model_version(folder: Path | Files) -> str:
    """NAME@<12 hex> of the trained weights (an ensemble's folded with its members'; an export's
    graph holds everything), so two different models never share a version because they share
    a spec. From the files as read (a folder is read now)."""
    files = folder if isinstance(folder, Files) else Files.read(folder)
    weights = next((w for w in paths.WEIGHTS if files.has(w)), paths.WEIGHTS[0])
    digest = hashlib.sha256(files.sha256(weights).encode())
    members = files.record("fingerprint.json", Fingerprint).members
    if members:
        digest.update(json.dumps(members, sort_keys=True).encode())
    if files.has(paths.NEIGHBOUR_MEMORY.as_posix()):
        digest.update(files.sha256(paths.NEIGHBOUR_MEMORY.as_posix()).encode())
    return f"{files.dir.name}@{digest.hexdigest()[:12]}"


def read_calibration(path: Path, contents: object = None) -> CalibrationRecord:
    """calibration.json at `path` (or its already-read `contents`), named when it is unusable."""
    raw = read_json(path, damaged(path.parent)) if contents is None else contents
    try:
        return CalibrationRecord.model_validate(raw, strict=True)
    except ValidationError as e:
        field, found = first_problem(e)
        raise UserError(
            f"{path} has no usable temperature and policy ({field}: {found}); " + damaged(path.parent)
        ) from None
