"""The files a language model's stages pass along, one pydantic model each (as records.py).

| file                              | model        | written by   | read by                     |
| --------------------------------- | ------------ | ------------ | --------------------------- |
| results/data.json                 | CorpusRecord | corpus       | promote, tokenize           |
| metrics/data.json                 | CorpusMetrics| corpus       | dvc metrics                 |
| data/tokens/<m>/manifest.json     | TokenRecord  | tokenize     | train, lm_evaluate          |
| metrics/<m>/train.json            | LmTrainRecord| train        | dvc metrics, report         |
| results/<m>/eval.json             | LmEvaluation | lm_evaluate  | gate, promote               |
| metrics/<m>/eval.json             | LmEvalMetrics| lm_evaluate  | dvc metrics                 |
| predictions/<m>/samples.jsonl     | SampleLine   | lm_evaluate  | people, the registry        |
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from reprogate.records.base import ModelVersion, Record, Sha256


class Part(Record):
    chars: int
    bytes: int
    sha256: str  # of data/corpus/<part>.txt


class CorpusRecord(Record):
    """results/data.json of a language model's pipeline: the canonical corpus and its split."""

    kind: Literal["text"] = "text"
    dataset: str
    split: dict[str, Any]  # the spec's split rule, as applied
    parts: dict[str, Part]  # train, validation
    raw_sha256: dict[str, str]

    @property
    def sha256(self) -> dict[str, str]:
        return {n: p.sha256 for n, p in self.parts.items()}


class CorpusMetrics(Record):
    dataset: str
    chars: dict[str, int]

    @classmethod
    def of(cls, r: CorpusRecord) -> CorpusMetrics:
        return cls(dataset=r.dataset, chars={n: p.chars for n, p in r.parts.items()})


class TokenPart(Record):
    tokens: int
    chars: int
    bytes: int
    source_sha256: str  # data/corpus/<part>.txt it was tokenized from


class TokenRecord(Record):
    """data/tokens/<m>/manifest.json: the tokenizer and each part's token ids."""

    tokenizer: dict[str, Any]  # the spec's tokenizer section
    vocab_size: int
    tokenizer_sha256: str
    parts: dict[str, TokenPart]


class LmTrainRecord(Record):
    """metrics/<m>/train.json of a language model: the same numbers on every rerun."""

    steps: int
    epochs: int
    windows: int  # training windows an epoch draws from (every start position)
    tokens_seen: int
    final_loss: float | None
    planned_minutes: float | None  # steps x the plan's measured seconds per update
    validation_nats_per_token: float | None  # at the last eval point (the whole split)


class LmSet(Record):
    """One split scored whole: every token after the first predicted once, in windows of the
    model's context (each window starts where the last one's targets ended)."""

    n_tokens: int  # predicted
    n_chars: int  # characters those tokens decode to
    n_bytes: int  # their UTF-8 bytes
    windows: int
    nats_per_token: float
    bits_per_token: float
    bits_per_char: float
    bits_per_byte: float
    nats_per_char: float
    perplexity: float  # per token
    data_sha256: Sha256  # data/corpus/<set>.txt


class LmEvaluation(Record):
    """results/<m>/eval.json of a language model."""

    kind: Literal["causal_lm"] = "causal_lm"
    heldout: Literal["validation"] = "validation"
    model_version: ModelVersion
    device: str
    sets: dict[str, LmSet]
    parameters: int
    parameters_without_embeddings: int
    tokens_seen: int
    tokens_per_parameter: float
    tokens_per_s: float | None = Field(
        None, description="As planned: tokens per update / the plan's measured seconds per update."
    )
    context: int
    vocab_size: int
    tokenizer: str


class LmEvalMetrics(Record):
    validation_bits_per_char: float
    validation_nats_per_char: float
    validation_bits_per_byte: float
    validation_perplexity: float
    train_bits_per_char: float | None
    parameters: int
    tokens_seen: int

    @classmethod
    def of(cls, ev: LmEvaluation) -> LmEvalMetrics:
        v, t = ev.sets["validation"], ev.sets.get("train")
        return cls(
            validation_bits_per_char=round(v.bits_per_char, 4),
            validation_nats_per_char=round(v.nats_per_char, 4),
            validation_bits_per_byte=round(v.bits_per_byte, 4),
            validation_perplexity=round(v.perplexity, 4),
            train_bits_per_char=round(t.bits_per_char, 4) if t else None,
            parameters=ev.parameters,
            tokens_seen=ev.tokens_seen,
        )


class SampleLine(Record):
    """A line of predictions/<m>/samples.jsonl: text generated from a fixed prompt and seed."""

    prompt: str
    text: str  # the prompt's continuation only
    seed: int
    temperature: float
    top_k: int | None
    max_new_tokens: int
    model_version: ModelVersion
