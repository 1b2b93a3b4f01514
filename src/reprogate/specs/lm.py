"""A language model's sections of a model spec: the tokenizer, the decoder, and its plan.

`causal_lm` is a GPT-style decoder (nanoGPT's shape): token embedding, learned or rotary
positions, n_layer pre-norm blocks of causal self-attention and an MLP (GELU or SwiGLU), a
final norm and an output projection, tied to the embedding by default.

A plan file (`kind: plan`, specs/models/<m>.plan.yaml) fixes how many updates a
`budget.train_minutes` run trains: `reprogate plan --write` measures this machine once and
writes it; every rerun and resume then trains exactly those steps.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from reprogate.specs.base import Fraction, ModelName, PosInt, Strict


class TokenizerConfig(Strict):
    kind: Literal["char", "bpe"] = Field(
        "char",
        description="char: one token per character of the corpus (its vocabulary, sorted); bpe: "
        "byte-level BPE (the tokenizers library) trained on the train part.",
    )
    vocab_size: int | None = Field(
        None, ge=257, le=65_536, description="bpe only: the vocabulary size (256 bytes + merges + 1)."
    )
    max_vocab: int = Field(
        1024,
        ge=2,
        le=65_536,
        description="char only: the most distinct characters the corpus may have; a corpus with more "
        "is refused at tokenize, before the embedding (vocabulary x d_model) is allocated. Raise it "
        "for a script with many characters, or use kind: bpe.",
    )

    @model_validator(mode="after")
    def _size(self) -> TokenizerConfig:
        if self.kind == "bpe" and self.vocab_size is None:
            raise ValueError("tokenizer kind bpe needs vocab_size, e.g. 512")
        if self.kind == "char" and self.vocab_size is not None:
            raise ValueError("a char tokenizer's vocabulary is the corpus's characters: remove vocab_size")
        return self


class CausalLmConfig(Strict):
    n_layer: PosInt = 4
    n_head: PosInt = 4
    d_model: PosInt = 128
    context: int = Field(64, ge=2, le=8192, description="Tokens a window holds (block size).")
    mlp: Literal["gelu", "swiglu"] = "gelu"
    mlp_ratio: float = Field(
        4.0, gt=0, le=16, description="Hidden width / d_model (SwiGLU: 2/3 of it per branch)."
    )
    positions: Literal["learned", "rope"] = "learned"
    tie_embeddings: bool = True
    bias: bool = False
    dropout: Fraction = 0.0
    eval_points: int = Field(
        8,
        ge=0,
        le=200,
        description="How often during training the whole validation split is scored (evenly "
        "spaced updates, the last one included): plots of validation loss against tokens and time.",
    )
    tokenizer: TokenizerConfig = TokenizerConfig()

    @model_validator(mode="after")
    def _heads(self) -> CausalLmConfig:
        if self.d_model % self.n_head:
            raise ValueError(
                f"d_model ({self.d_model}) must be a multiple of n_head ({self.n_head}); "
                f"e.g. n_head {next(h for h in (8, 4, 2, 1) if self.d_model % h == 0)}"
            )
        if self.positions == "rope" and (self.d_model // self.n_head) % 2:
            raise ValueError(f"rope needs an even head size; d_model/n_head is {self.d_model // self.n_head}")
        return self


class Measured(Strict):
    """What `reprogate plan --write` measured, kept for the reader (never read back by training)."""

    update_s: float = Field(gt=0)
    checkpoint_s: float = Field(ge=0)
    updates_timed: PosInt
    tokens_per_s: float = Field(gt=0)
    device: str
    host: str
    cpu: str
    threads: PosInt
    torch: str
    at: str = Field(description="UTC time of the measurement, ISO 8601.")


class PlanSpec(Strict):
    kind: Literal["plan"]
    model: ModelName = Field(description="The model spec this plan is for.")
    train_minutes: float = Field(gt=0, description="The budget it was measured for.")
    speed_key: str = Field(
        pattern=r"^[0-9a-f]{64}$",
        description="Hash of the spec fields that decide an update's time (model shape, batch, "
        "device, precision, threads, processes): another value means the plan is stale.",
    )
    steps: PosInt = Field(description="Optimizer updates the run trains: what fits in train_minutes.")
    measured: Measured


def speed_fields(spec: Any) -> dict[str, Any]:
    """The model spec fields an update's time depends on (the plan's speed_key hashes them)."""
    return {
        # Not the caps a stage checks before training (tokenizer.max_vocab): they change no update.
        "causal_lm": spec.causal_lm.model_dump(
            mode="json", exclude={"eval_points": True, "tokenizer": {"max_vocab"}}
        ),
        **{k: getattr(spec, k) for k in ("micro_batch", "grad_accum", "device", "precision", "threads")},
        "processes": spec.processes,
    }
