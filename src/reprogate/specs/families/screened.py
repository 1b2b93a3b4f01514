"""Family `screened`: a frozen encoder and a linear head whose out-of-scope class also learns
queries that are not one request. Beside the data spec's negatives it trains on texts composed
from the train partition alone (models/screened.py): two utterances of different intents joined
the way people join requests ("and", "also", "then", "plus", "but first", a comma), and
utterances cut to their vague cores ("my card", "help with the transfer"). Calibration and the
routing policy then treat those as they treat any out-of-scope answer: sent to review.

It is declared beside the built-in families as an entry point of this package (pyproject.toml),
the way a user's own family is (docs/your-own-model.md), so adding it changed no other family's
code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from reprogate.specs.base import PosInt, Strict
from reprogate.specs.families.encoder import Encoder, EncoderConfig, MissingExtra, resolve_encoder_path
from reprogate.specs.family import Refused


class ComposeConfig(Strict):
    pairs: int = Field(
        2000, ge=0, le=50_000, description="Two train utterances of different intents joined by a connector."
    )
    cores: int = Field(
        800,
        ge=0,
        le=50_000,
        description="Train utterances cut to a vague core ('my card'), some in a frame ('about my card').",
    )
    max_words: PosInt = Field(
        12,
        le=64,
        description="Only utterances of at most this many words are joined (two long ones are not a query).",
    )
    seed: int = Field(0, description="Which utterances, connectors and frames are drawn.")


class ScreenedConfig(Strict):
    encoder: EncoderConfig = Field(description="The frozen encoder (encoder.mode must be frozen).")
    compose: ComposeConfig = Field(default_factory=ComposeConfig)

    @model_validator(mode="after")
    def _some(self) -> ScreenedConfig:
        if self.compose.pairs == 0 and self.compose.cores == 0:
            raise ValueError(
                "screened.compose asks for 0 pairs and 0 cores, which composes nothing; ask for some "
                "of either, or use family encoder"
            )
        return self


class Screened(Encoder):
    name = "screened"
    config = ScreenedConfig
    build = "reprogate.models.screened:build"
    assets = "reprogate.models.screened:export_assets"
    setup = "reprogate.train.screened:Setup"

    def rules(self, spec: Any) -> None:
        if spec.screened.encoder.mode != "frozen":
            raise ValueError(
                f"screened.encoder.mode is '{spec.screened.encoder.mode}': the composed texts are encoded "
                "once by a frozen encoder; use mode: frozen (or family encoder to fine-tune)"
            )
        if not spec.head.out_of_scope_class:
            raise ValueError(
                "family screened trains its composed texts as the out-of-scope class, but "
                "head.out_of_scope_class is false; set it to true"
            )

    def references(self, spec: Any, root: Path) -> None:
        try:
            resolve_encoder_path(spec.screened.encoder.model, root)
        except MissingExtra:
            pass
        except ValueError as e:
            raise Refused(("screened", "encoder"), str(e)) from None

    def missing_extra(self, spec: Any, root: Path) -> str | None:
        try:
            resolve_encoder_path(spec.screened.encoder.model, root)
        except MissingExtra as e:
            return f"make venv EXTRAS={e.extra}"
        except ValueError:
            return None
        return None

    def caches_embeddings(self, spec: Any) -> bool:
        return True
