"""What every model family provides, and the helpers they share.

A family's `build(spec, n_out, root)` returns a torch module and a featurizer. The featurizer
turns texts into per-example features (`encode`), stacks a micro-batch of them into the
module's keyword inputs (`collate`), and stores/loads a whole split (`to_tensors` /
`from_tensors`) so the `features@m` stage computes them once. `key()` says what the features
depend on: a cached file is used only when its key matches.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Featurizer(Protocol):
    # Texts longer than the featurizer takes are cut and counted here (0 for those that cut none).
    truncated: int

    def encode(self, texts: list[str]) -> Any: ...

    def collate(self, feats: Any) -> dict[str, torch.Tensor]: ...

    def key(self) -> dict[str, Any]: ...

    def to_tensors(self, feats: Any) -> dict[str, torch.Tensor]: ...

    def from_tensors(self, t: dict[str, torch.Tensor]) -> Any: ...


class FolderFiles(Protocol):
    """A model folder's files as whoever opened it read them (folder/manifest.Files): what a
    family built from other folders (an ensemble) hashes and loads, without reading them again."""

    dir: Path
    damaged: str

    def sha256(self, rel: str) -> str: ...

    def tensors(self, rel: str) -> dict[str, torch.Tensor]: ...


@runtime_checkable
class OnDevice(Protocol):
    """A featurizer that runs a network itself (a frozen encoder), loaded onto `device` when first
    needed; the others only collate tensors that the model moves."""

    device: torch.device


def feature_key(featurizer: Featurizer) -> str:
    return hashlib.sha256(json.dumps(featurizer.key(), sort_keys=True).encode()).hexdigest()


def concat(a, b):
    """Two splits' features as one (train and negatives)."""
    return torch.cat([a, b]) if torch.is_tensor(a) else a + b


def ragged_to_tensors(feats: list[list[int]]) -> dict[str, torch.Tensor]:
    lengths = torch.tensor([len(f) for f in feats], dtype=torch.long)
    offsets = torch.zeros(len(feats) + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(lengths, 0)
    return {"flat": torch.tensor([i for f in feats for i in f], dtype=torch.long), "offsets": offsets}


def tensors_to_ragged(t: dict[str, torch.Tensor]) -> list[list[int]]:
    flat, off = t["flat"].tolist(), t["offsets"].tolist()
    return [flat[off[i] : off[i + 1]] for i in range(len(off) - 1)]


def predict_logits(model: torch.nn.Module, featurizer: Featurizer, feats, device, batch: int = 256):
    model.eval()
    out = []
    with torch.inference_mode():
        for i in range(0, len(feats), batch):
            b = {k: v.to(device) for k, v in featurizer.collate(feats[i : i + batch]).items()}
            out.append(model(**b).float().cpu())
    return torch.cat(out)
