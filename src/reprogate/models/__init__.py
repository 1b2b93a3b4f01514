"""Model families. Each module offers `build(spec, n_out, root) -> (module, featurizer)`.

A featurizer turns texts into per-example features (`encode`), stacks a micro-batch of them
into tensors (`collate`), and stores/loads a whole split (`to_tensors` / `from_tensors`) so
the `features@m` stage computes them once. `key()` says what the features depend on: a cached
file is used only when its key matches.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from reprogate.specs import ModelSpec


def build(spec: ModelSpec, n_out: int, root: Path):
    if spec.family == "ngram":
        from reprogate.models import ngram

        return ngram.build(spec, n_out, root)
    if spec.family == "ensemble":
        from reprogate.models import ensemble

        return ensemble.build(spec, n_out, root)
    from reprogate.models import encoder

    return encoder.build(spec, n_out, root)


def feature_key(featurizer) -> str:
    return hashlib.sha256(json.dumps(featurizer.key(), sort_keys=True).encode()).hexdigest()


def ragged_to_tensors(feats: list[list[int]]) -> dict[str, torch.Tensor]:
    lengths = torch.tensor([len(f) for f in feats], dtype=torch.long)
    offsets = torch.zeros(len(feats) + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(lengths, 0)
    return {"flat": torch.tensor([i for f in feats for i in f], dtype=torch.long), "offsets": offsets}


def tensors_to_ragged(t: dict[str, torch.Tensor]) -> list[list[int]]:
    flat, off = t["flat"].tolist(), t["offsets"].tolist()
    return [flat[off[i] : off[i + 1]] for i in range(len(off) - 1)]
