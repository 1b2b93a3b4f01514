"""The gate spec: the thresholds every candidate must meet, and how it is compared with production."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from reprogate.specs.base import Fraction, Strict


class Thresholds(Strict):
    heldout_accuracy_min: float = Field(0.90, ge=0.0, le=1.0)
    real_utterance_accuracy_min: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="Least accuracy on every real-utterance set the gate judges (use: evaluate); "
        "no such rule when the data spec declares none.",
    )
    challenge_action_rate_max: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Most share of a challenge set's queries (unrelated, ambiguous, several "
        "requests in one) acted on, on every challenge set the gate judges. null: no such rule.",
    )
    challenge_action_rate_max_by_kind: dict[str, Fraction] = Field(
        default_factory=dict,
        description="Most share acted on per kind of challenge query, e.g. {unrelated: 0.0, "
        "ambiguous: 0.05, multi_intent: 0.05}: one rule per kind, on every challenge set the gate "
        "judges. A kind no judged set has fails (the evidence is missing).",
    )
    ece_max: float = Field(0.10, ge=0.0, le=1.0)
    false_positive_action_rate_max: float = Field(0.01, ge=0.0, le=1.0)
    wrong_action_rate_max: float = Field(0.02, ge=0.0, le=1.0)
    coverage_min: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Least share of in-scope test queries acted on. A model that sends everything "
        "to review makes no wrong action and does no work. null: no such rule.",
    )
    require_resume_equivalence: bool = True
    export_agreement_min: float | None = Field(
        0.995,
        ge=0.0,
        le=1.0,
        description="An exported candidate (family export): least share of held-out test items on "
        "which it predicts the intent its source predicts. null: no such rule.",
    )
    val_bits_per_char_max: float | None = Field(
        None,
        gt=0.0,
        description="Language models (a pipeline on a kind: text corpus): most bits per character on "
        "the whole validation split. The classifier thresholds above do not apply to them, nor this one "
        "to classifiers. null: no such rule.",
    )


class ProductionComparison(Strict):
    enabled: bool = True
    metric: Literal["heldout_accuracy"] = "heldout_accuracy"
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    bootstrap_samples: int = Field(1000, ge=100)
    seed: int = 0


class PolicyFit(Strict):
    confidence: float = Field(
        0.9,
        ge=0.0,
        lt=1.0,
        description="calibrate@m picks the routing policy whose wrong-action and false-positive "
        "limits hold for the one-sided Clopper-Pearson upper bound at this confidence on the "
        "calibration data (0: the rates seen). A set too small to show its limit even with no "
        "error is held to the rate seen, and calibration.json records which applied.",
    )
    two_requests_max: Fraction | None = Field(
        0.01,
        description="Most share of the calibration queries the two-requests rule may send to review "
        "(a query whose clauses, scored alone, name two intents); its confidence is fitted to it. "
        "null: no such rule.",
    )
    ambiguous_max: Fraction | None = Field(
        0.01,
        description="Most share of the calibration queries the ambiguity rule may send to review (a "
        "query whose probabilities spread over many intents); its entropy level is fitted to it. "
        "null: no such rule.",
    )
    too_short_max: Fraction | None = Field(
        0.01,
        description="Most share of the calibration queries the too-short rule may send to review: "
        "queries of at most N words, N the most that stays within it. null: no such rule.",
    )


class GateSpec(Strict):
    kind: Literal["gate"]
    description: str = ""
    thresholds: Thresholds = Thresholds()
    policy_fit: PolicyFit = PolicyFit()
    compare_to_production: ProductionComparison = ProductionComparison()
