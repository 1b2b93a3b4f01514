"""A model family written outside reprogate: a bag-of-words MLP (docs/your-own-model.md).

Nothing here is special to the tests: copied beside a project's params.yaml, a spec names it as
`family: bow_mlp:BowMlp`; packaged, as an entry point of the group `reprogate.families`.
"""

from __future__ import annotations

import zlib

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from reprogate.models.base import ragged_to_tensors, tensors_to_ragged
from reprogate.specs.family import Family


class BowMlpConfig(BaseModel):
    """The spec's `bow_mlp:` section."""

    model_config = ConfigDict(extra="forbid")
    buckets: int = Field(4096, ge=16, description="Hash buckets the words fall into.")
    hidden: int = Field(32, ge=1, description="Width of the hidden layer.")


class Words:
    """Lower-cased words hashed into buckets (crc32: the same ids in every process)."""

    truncated = 0

    def __init__(self, buckets: int):
        self.buckets = buckets

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [[zlib.crc32(w.encode()) % self.buckets for w in t.lower().split()] or [0] for t in texts]

    def collate(self, feats: list[list[int]]) -> dict[str, torch.Tensor]:
        lengths = torch.tensor([0] + [len(f) for f in feats[:-1]])
        return {"ids": torch.tensor([i for f in feats for i in f]), "offsets": torch.cumsum(lengths, 0)}

    def key(self) -> dict:
        return {"family": "bow_mlp", "buckets": self.buckets}

    def to_tensors(self, feats: list[list[int]]) -> dict[str, torch.Tensor]:
        return ragged_to_tensors(feats)

    def from_tensors(self, t: dict[str, torch.Tensor]) -> list[list[int]]:
        return tensors_to_ragged(t)


class BowMlpModel(nn.Module):
    def __init__(self, buckets: int, hidden: int, n_out: int, dropout: float):
        super().__init__()
        self.bag = nn.EmbeddingBag(buckets, hidden, mode="mean")
        self.mlp = nn.Sequential(nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, n_out)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.head(self.mlp(self.bag(ids, offsets)))


def build(spec, n_out: int, root=None):
    cfg = spec.config
    return BowMlpModel(cfg.buckets, cfg.hidden, n_out, spec.head.dropout), Words(cfg.buckets)


class BowMlp(Family):
    name = "bow_mlp"
    config = BowMlpConfig
    build = build
