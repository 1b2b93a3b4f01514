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

from typing import Any

from pydantic import Field, model_validator

from reprogate.specs.base import PosInt, Strict
from reprogate.specs.families.encoder import Encoder, EncoderConfig


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
    # Where the composed texts go: the out-of-scope class (flagged gives them an output of its own).
    needs_out_of_scope = True

    def rules(self, spec: Any) -> None:
        if spec.config.encoder.mode != "frozen":
            raise ValueError(
                f"{self.name}.encoder.mode is '{spec.config.encoder.mode}': the composed texts are "
                "encoded once by a frozen encoder; use mode: frozen (or family encoder to fine-tune)"
            )
        if not spec.head.out_of_scope_class and self.needs_out_of_scope:
            raise ValueError(
                f"family {self.name} trains its composed texts as the out-of-scope class, but "
                "head.out_of_scope_class is false; set it to true"
            )

    def encoder_of(self, spec: Any) -> tuple[tuple[str, ...], EncoderConfig]:
        # The composed texts are encoded by train@m; the prepared splits' features are the encoder's.
        return (self.name, "encoder"), spec.config.encoder
