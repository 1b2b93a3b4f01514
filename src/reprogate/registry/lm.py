"""A language model's run (lm/, family causal_lm) as registry rows, beside the classifiers'.

The same tables: a `runs` row (the classifier's columns that have no meaning here, accuracy and
calibration, are null; `heldout_set` is validation), the training curve and raw updates as for
any trained run, and `evaluations` rows of kind `language_model` for each scored split (train,
validation: nats and bits per token, bits per character and byte, perplexity, `n` the tokens
predicted) plus rows of kind `model_size` under set `model` (parameters with and without
embeddings, tokens seen, tokens per parameter). Samples are not predictions: no
`predictions` rows.
"""

from __future__ import annotations

from typing import Any

from reprogate.records.base import record_key
from reprogate.records.lm import LmEvaluation, LmTrainRecord
from reprogate.records.train import Fingerprint, ModelConfig, train_key
from reprogate.registry.tables import run_identity

SPLIT_METRICS = (
    "nats_per_token",
    "bits_per_token",
    "bits_per_char",
    "bits_per_byte",
    "nats_per_char",
    "perplexity",
)
SIZE_METRICS = ("parameters", "parameters_without_embeddings", "tokens_seen", "tokens_per_parameter")


def run_row(
    model: str,
    evaluation: LmEvaluation,
    fp: Fingerprint,
    config: ModelConfig,
    record: LmTrainRecord | None,
    stamp: dict[str, Any],
) -> dict[str, Any]:
    spec = config.spec
    return {
        **run_identity(model, fp, spec, record_key(evaluation)),
        "family": config.family,
        "model_version": evaluation.model_version,
        "train_key": train_key(fp),
        "processes": int(spec.get("processes", 1)),
        "device": evaluation.device,
        "steps": record.steps if record else None,
        "epochs": record.epochs if record else None,
        "final_loss": record.final_loss if record else None,
        "validation_accuracy": None,
        "temperature": None,
        "threshold": None,
        "margin": None,
        "heldout_set": evaluation.heldout,
        "heldout_accuracy": None,
        "members": [],
        **stamp,
    }


def evaluations(run_key: str, evaluation: LmEvaluation) -> list[dict[str, Any]]:
    none = {"ci_low": None, "ci_high": None}
    rows = [
        {"run_key": run_key, "set": name, "metric": metric, "kind": "language_model",
         "value": float(getattr(s, metric)), **none, "n": s.n_tokens, "data_sha256": s.data_sha256}
        for name, s in sorted(evaluation.sets.items())
        for metric in SPLIT_METRICS
    ]  # fmt: skip
    rows += [
        {"run_key": run_key, "set": "model", "metric": metric, "kind": "model_size",
         "value": float(getattr(evaluation, metric)), **none, "n": None, "data_sha256": None}
        for metric in SIZE_METRICS
    ]  # fmt: skip
    return rows
