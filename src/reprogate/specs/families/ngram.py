"""Family `ngram`: hashed word and character n-grams into an embedding bag and a linear head
(fastText's shape), the fast baseline every classifier pipeline can train in seconds."""

from __future__ import annotations

from pydantic import Field, model_validator

from reprogate.specs.base import Fraction, Pair, PosInt, Strict
from reprogate.specs.family import Family


class NgramConfig(Strict):
    word_ngrams: Pair = Field([1, 2], description="Min and max word n-gram length.")
    char_ngrams: Pair = Field([2, 5], description="Min and max character n-gram length.")
    buckets: int = Field(1 << 17, ge=1024, description="Hash buckets of the embedding bag.")
    dim: PosInt = 64
    dropout: Fraction = 0.0

    @model_validator(mode="after")
    def _ordered(self) -> NgramConfig:
        for name in ("word_ngrams", "char_ngrams"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise ValueError(f"{name} is [{lo}, {hi}]: the minimum must not exceed the maximum")
        return self


class Ngram(Family):
    name = "ngram"
    config = NgramConfig
    onnx = "reprogate.export.graphs.ngram:onnx"
    build = "reprogate.models.ngram:build"
