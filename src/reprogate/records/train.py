"""A model folder's config.json and fingerprint.json, and metrics/<m>/train.json of train and combine."""

from __future__ import annotations

from typing import Any

from reprogate.records.base import Record, record_key


class ModelConfig(Record):
    family: str  # as the spec names it: specs/family.py finds it
    n_out: int
    featurizer: dict[str, Any]  # what the features depend on (the featurizer's key)
    spec: dict[str, Any]  # the model spec it was trained from, validated again on load


class Fingerprint(Record):
    """Where a model folder came from: spec, data, code, packages, or an ensemble's member versions."""

    spec_hash: str
    data_hash: str | None = None
    labels_hash: str | None = None
    code_hash: str | None = None
    environment: dict[str, str] | None = None
    encoder_sha256: str | None = None
    total_steps: int | None = None
    members: dict[str, Any] | None = None  # member -> sha256 of its weights and calibration


def train_key(fingerprint: Fingerprint) -> str:
    """What a training run is, as a key: its fingerprint (spec, data, code, environment, steps).
    Its raw update log is named by it, and the registry joins a run to that log by it."""
    return record_key(fingerprint)


class TrainRecord(Record):
    """What a run trained to: the same numbers whenever the same inputs are trained again (how
    long it took and how much memory it used are telemetry, in its RunLogEntry)."""

    steps: int
    epochs: int
    examples: int
    final_loss: float | None
    validation_accuracy: float
    truncated_texts: int


class CombineRecord(Record):
    weights: dict[str, float]
    calibration_nll: float
    validation_accuracy: float
    member_validation_accuracy: dict[str, float]
    weights_note: str | None = None
