"""Family `ensemble`: a weighted sum of member models' calibrated log-probabilities.

Features of an ensemble are its members' calibrated log-probabilities per item ([n, K, C]);
the model is K non-negative weights, fitted on the calibration partition by `combine@e`.
The featurizer's key holds the sha256 of every member's weights and calibration, so cached
features are used only while the members are exactly the ones they were computed from.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from reprogate.hashing import sha256_file
from reprogate.specs import ModelSpec


class EnsembleFeaturizer:
    def __init__(self, root: Path, members: list[str]):
        self.root, self.members = root, members
        self.models_dir = root / "models"  # where the member folders are (or a promoted copy)
        # Where members are scored (auto|cpu|cuda|mps); None: each on its own spec's device.
        # Not `device`: stages set that name to a torch.device on featurizers that have it.
        self.member_device: str | None = None
        self._scorers = None
        self._key: tuple[Path, dict] | None = None

    def scorers(self):
        if self._scorers is None:
            from reprogate.inference import Scorer

            self._scorers = [
                (Scorer(self.root, m, self.models_dir / m, self.member_device), self._temperature(m))
                for m in self.members
            ]
        return self._scorers

    def _temperature(self, member: str) -> float:
        from reprogate.inference import Policy

        return Policy.load(self.models_dir / member / "calibration.json").temperature

    @staticmethod
    def _stack(logits_per_member) -> torch.Tensor:
        return torch.stack([torch.log_softmax(x.double() / t, -1).float() for x, t in logits_per_member], 1)

    def encode(self, texts: list[str]) -> torch.Tensor:
        return self._stack([(s.text_logits(texts), t) for s, t in self.scorers()])

    def split(self, name: str) -> torch.Tensor:
        """Members' calibrated log-probabilities on a prepared split (their cached features)."""
        return self._stack([(s.split_logits(name), t) for s, t in self.scorers()])

    def collate(self, feats) -> dict[str, torch.Tensor]:
        return {"logp": torch.stack(list(feats))}

    def key(self) -> dict:
        # Members do not change while this process runs: hash their (large) weights once per folder.
        d = self.models_dir
        if self._key is None or self._key[0] != d:
            self._key = (
                d,
                {
                    "family": "ensemble",
                    "members": {
                        m: {
                            "model": sha256_file(d / m / "model.safetensors"),
                            "calibration": sha256_file(d / m / "calibration.json"),
                        }
                        for m in self.members
                    },
                },
            )
        return self._key[1]

    def config(self) -> dict:
        return {"members": self.members}

    def to_tensors(self, feats: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logp": feats}

    def from_tensors(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        return t["logp"]


class EnsembleCombiner(nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.log_w = nn.Parameter(torch.zeros(k))

    def weights(self) -> torch.Tensor:
        return self.log_w.exp()

    def forward(self, logp: torch.Tensor) -> torch.Tensor:
        return (self.weights()[None, :, None] * logp).sum(1)


def build(spec: ModelSpec, n_out: int, root: Path):
    members = spec.ensemble.members
    return EnsembleCombiner(len(members)), EnsembleFeaturizer(root, members)
