"""An exported model folder with the interface calibrate, evaluate and serving read
(folder/scorer.Scorer's): labels, the calibrated temperature, logits of prepared splits and of
raw texts. Every logit comes from the exported runtime: a split's from the cache export@m
filled by running it (data/features/<m>/), a query's from running it again.
"""

from __future__ import annotations

from pathlib import Path

import torch

from reprogate.data.prepared import split_features
from reprogate.export.runtime import Runtime
from reprogate.folder.files import read_calibration
from reprogate.folder.manifest import Files
from reprogate.records.train import Fingerprint, ModelConfig
from reprogate.specs.base import OOS_LABEL
from reprogate.specs.model import ModelSpec
from reprogate.utils import paths
from reprogate.utils.errors import UserError


class RuntimeFeaturizer:
    """The export's features of a text are its logits, as the runtime computes them."""

    truncated = 0  # the runtime truncates as its source did; features@source counted it

    def __init__(self, key: dict, files: Files, threads: int, batch: int):
        self._key, self.files, self.threads, self.batch = key, files, threads, batch
        self._runtime: Runtime | None = None

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            self._runtime = Runtime(self.files, self.threads, self.batch)
        return self._runtime

    def encode(self, texts: list[str]) -> torch.Tensor:
        return torch.from_numpy(self.runtime.logits(texts))

    def collate(self, feats) -> dict[str, torch.Tensor]:
        return {"logits": torch.stack(list(feats))}

    def key(self) -> dict:
        return self._key

    def to_tensors(self, feats: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": feats}

    def from_tensors(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        return t["logits"]


class ExportScorer:
    """models/<m>/ of family export, scored by ONNX Runtime on the CPU."""

    def __init__(
        self,
        root: Path,
        name: str,
        model_dir: Path | None = None,
        device: str | None = None,
        members_dir: Path | None = None,  # unused: the graph holds its members
        files: Files | None = None,  # the folder as read and verified (folder/manifest.py)
        members: dict | None = None,  # unused, as members_dir
    ):
        self.root, self.name = root, name
        self.dir = model_dir or root / paths.model_dir(name)
        self.files = files or Files.read(self.dir)
        config = self.files.record("config.json", ModelConfig)
        self.labels: list[str] = self.files.json("labels.json")
        self.spec = ModelSpec.model_validate(config.spec)
        if device not in (None, "auto", "cpu"):
            raise UserError(
                f"--device {device}: {self.dir} is an ONNX export, answered by ONNX Runtime on the CPU "
                "(the installed onnxruntime has no GPU provider). Use --device cpu, or serve its source "
                f"model (--model models/{self.spec.export.source}) on {device}."
            )
        self.device = torch.device("cpu")
        self.fingerprint = self.files.record("fingerprint.json", Fingerprint)
        export = self.spec.export
        self.featurizer = RuntimeFeaturizer(config.featurizer, self.files, self.spec.threads, export.calls_of)
        self._temperature: float | None = None

    @property
    def temperature(self) -> float:
        if self._temperature is None:
            raw = self.files.json("calibration.json") if self.files.has("calibration.json") else None
            self._temperature = read_calibration(self.dir / "calibration.json", raw).temperature
        return self._temperature

    def logits_for(self, feats: torch.Tensor) -> torch.Tensor:
        return feats

    def split_features(self, split: str) -> torch.Tensor:
        return split_features(self.root, self.name, self.featurizer, split)

    def split_logits(self, split: str) -> torch.Tensor:
        return self.split_features(split)

    def text_logits(self, texts: list[str]) -> torch.Tensor:
        return self.featurizer.encode(texts)

    @property
    def oos_index(self) -> int | None:
        return self.labels.index(OOS_LABEL) if OOS_LABEL in self.labels else None
