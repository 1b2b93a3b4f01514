"""Family `ngram`: hashed word and character n-grams (utils/ngrams.py) -> EmbeddingBag ->
linear head."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from reprogate.models.base import ragged_to_tensors, tensors_to_ragged
from reprogate.specs.model import ModelSpec
from reprogate.utils.ngrams import ngram_ids


class NgramFeaturizer:
    truncated = 0  # every text is hashed whole

    def __init__(self, word: list[int], char: list[int], buckets: int):
        self.word, self.char, self.buckets = tuple(word), tuple(char), buckets

    def ids(self, text: str) -> list[int]:
        return ngram_ids(text, self.word, self.char, self.buckets)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [self.ids(t) for t in texts]

    def collate(self, feats: list[list[int]]) -> dict[str, torch.Tensor]:
        offsets = [0]
        for f in feats[:-1]:
            offsets.append(offsets[-1] + len(f))
        flat = [i for f in feats for i in f]
        return {"ids": torch.tensor(flat, dtype=torch.long), "offsets": torch.tensor(offsets)}

    def config(self) -> dict:
        return {"word_ngrams": list(self.word), "char_ngrams": list(self.char), "buckets": self.buckets}

    def key(self) -> dict:
        return {"family": "ngram", "hash": "crc32", **self.config()}

    def to_tensors(self, feats: list[list[int]]) -> dict[str, torch.Tensor]:
        return ragged_to_tensors(feats)

    def from_tensors(self, t: dict[str, torch.Tensor]) -> list[list[int]]:
        return tensors_to_ragged(t)


class NgramClassifier(nn.Module):
    def __init__(self, buckets: int, dim: int, n_out: int, dropout: float):
        super().__init__()
        self.bag = nn.EmbeddingBag(buckets, dim, mode="mean")
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(dim, n_out)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.bag(ids, offsets)))


def build(spec: ModelSpec, n_out: int, root: Path | None = None):
    cfg = spec.ngram
    assert cfg is not None
    model = NgramClassifier(cfg.buckets, cfg.dim, n_out, max(cfg.dropout, spec.head.dropout))
    return model, NgramFeaturizer(cfg.word_ngrams, cfg.char_ngrams, cfg.buckets)
