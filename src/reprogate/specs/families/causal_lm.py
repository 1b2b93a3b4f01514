"""Family `causal_lm`: a GPT-style decoder (nanoGPT's shape) trained on a text corpus.

Token embedding, learned or rotary positions, n_layer pre-norm blocks of causal self-attention
and an MLP (GELU or SwiGLU), a final norm and an output projection, tied to the embedding by
default. It is the language-model pipeline's family: its data spec is a corpus (kind: text), and
it may train for a wall-clock budget (`budget.train_minutes`, fixed by a committed plan).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from reprogate.specs.base import Fraction, PosInt, Strict
from reprogate.specs.family import Family
from reprogate.utils import paths


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


class CausalLm(Family):
    name = "causal_lm"
    config = CausalLmConfig
    kind = "lm"
    planned = True
    data = "text"
    setup = "reprogate.lm.training:LmSetup"
    files = paths.LM_FILES
    inputs = ("data/tokens/${key}",)
    plots = tuple(
        {f"plots/${{key}}/validation_by_{x}.tsv": {"x": x, "y": "nats_per_token", "cache": False}}
        for x in ("tokens", "seconds")
    )
    generates = True
    scorer = None  # a language model is scored by its kind's code (lm/evaluate.py, predict/lm.py)
