"""The `encoder` family's section of a model spec: which encoder, how it is pooled and tuned."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from reprogate.specs.base import Fraction, PosInt, Strict


class ContrastiveConfig(Strict):
    """Sentence pairs from the training intents (SetFit's idea, trained jointly with the head):
    each in-scope text of a micro-batch is paired with another text of its intent, drawn from the
    update's seed, and an InfoNCE loss over the batch's pairs makes the pair the nearest of all
    (texts of the same intent are not counted as negatives; out-of-scope texts are negatives only)."""

    weight: float = Field(
        1.0, gt=0.0, le=100.0, description="The pair loss's weight beside the head's cross-entropy (1)."
    )
    temperature: float = Field(
        0.05, gt=0.0, le=1.0, description="Softmax temperature over the pairs' cosine similarities."
    )


class LoraConfig(Strict):
    r: PosInt = 8
    alpha: PosInt = 16
    dropout: Fraction = 0.0
    target_modules: list[str] = Field(default_factory=lambda: ["query", "value"])


class EncoderConfig(Strict):
    model: str = Field(
        description="A local model folder, 'package:MODULE[/SUBDIR]' for a model shipped "
        "inside an installed Python package, or a hub id pinned as 'org/name@<40-hex commit>'."
    )
    mode: Literal["full", "frozen", "lora"] = "full"
    pooling: Literal["mean", "cls"] = "mean"
    layers: PosInt = Field(
        1,
        description="Pool each of the last N hidden layers and concatenate them (the head "
        "input grows N-fold). Lower layers carry lexical detail the last one smooths away.",
    )
    normalize: bool = Field(False, description="L2-normalise each pooled layer before it reaches the head.")
    max_length: PosInt = 64
    lora: LoraConfig | None = None
    contrastive: ContrastiveConfig | None = Field(
        None,
        description="Full or LoRA mode: also pull each training text's pooled embedding towards "
        "another text of its intent and away from the micro-batch's other intents (SetFit-style "
        "sentence pairs), beside the head's cross-entropy.",
    )

    @model_validator(mode="after")
    def _lora(self) -> EncoderConfig:
        if self.mode == "lora" and self.lora is None:
            object.__setattr__(self, "lora", LoraConfig())
        if self.mode != "lora" and self.lora is not None:
            raise ValueError(f"encoder.lora is set but encoder.mode is '{self.mode}'; use mode: lora")
        if self.mode == "frozen" and self.contrastive is not None:
            raise ValueError(
                "encoder.contrastive fine-tunes the encoder, but encoder.mode is 'frozen'; use mode: "
                "full or lora, or remove contrastive"
            )
        return self
