"""What `reprogate serve` takes and answers: the request and response bodies of its API
(their JSON Schema is /openapi.json)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from reprogate.predict.lm import MAX_NEW_TOKENS, MAX_PROMPT_CHARS
from reprogate.utils.queries import MAX_QUERY_CHARS

MAX_TEXT_CHARS = MAX_QUERY_CHARS
MAX_BATCH = 64
MAX_BODY_BYTES = 256 * 1024

Text = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=MAX_TEXT_CHARS)]


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: Text | None = Field(None, description="One query.")
    texts: list[Text] | None = Field(None, min_length=1, max_length=MAX_BATCH, description="Several queries.")

    @model_validator(mode="after")
    def _one(self) -> PredictRequest:
        if (self.text is None) == (self.texts is None):
            raise ValueError('give exactly one of "text" (a string) or "texts" (a list of strings)')
        for t in [self.text] if self.text is not None else self.texts:
            if not t.strip():
                raise ValueError("a query is blank; every query needs some text")
        return self


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt: Annotated[str, StringConstraints(strict=True, min_length=1, max_length=MAX_PROMPT_CHARS)]
    max_tokens: int = Field(200, ge=1, le=MAX_NEW_TOKENS, strict=True)
    seed: int = Field(0, ge=0, le=2**63 - 1, strict=True)
    temperature: float = Field(0.8, gt=0.0, le=5.0)
    top_k: int | None = Field(None, ge=1, strict=True)


class Generated(BaseModel):
    prompt: str
    text: str = Field(description="The continuation only.")
    tokens: int
    seed: int
    temperature: float
    model_version: str
    latency_ms: float


class Alternative(BaseModel):
    intent: str
    probability: float


class Prediction(BaseModel):
    text: str
    intent: str
    probability: float = Field(description="Calibrated probability of the top intent.")
    alternatives: list[Alternative] = Field(description="Top-3 intents with calibrated probabilities.")
    route: Literal["act", "review"]
    reasons: list[str] = Field(
        description="Why review: low_confidence, small_margin, out_of_scope, two_requests, ambiguous, "
        "too_short."
    )
    model_version: str
    latency_ms: float


class PredictResponse(BaseModel):
    predictions: list[Prediction]


class ErrorResponse(BaseModel):
    error: str
    details: list[dict[str, Any]] = []
