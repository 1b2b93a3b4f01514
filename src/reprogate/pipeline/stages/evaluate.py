"""Stage `evaluate@m`: predictions and metrics on every evaluation set of the data spec.

Sets: validation, the held-out test, and every eval set marked `use: evaluate` (CLINC150
oos_test, real utterances). Writes predictions/<m>/<set>.jsonl (per item: id, text, gold,
predicted, then the rest of the Prediction object: probability, alternatives, route, reasons,
model version), results/<m>/eval.json (every number, with intervals and data hashes), its
headline metrics/<m>/eval.json, and plot data under plots/<m>/ (confusion matrix, reliability
diagram, coverage-accuracy curve, per-intent precision, recall and F1 on the held-out set).
"""

from __future__ import annotations

from typing import Any

from reprogate.pipeline.context import Context, Result
from reprogate.specs.pipeline import Pipeline
from reprogate.utils.paths import SCORED_FILES

PER_MODEL = "all"
NUMERIC = True  # its outputs are floats: it reruns when params.yaml's numerics change


def dvc(p: Pipeline) -> dict[str, Any]:
    return {
        "deps": [
            "data/prepared",
            "data/features/${item.features}",
            "models/${key}/${item.weights}",
            *(f"models/${{key}}/{f}" for f in SCORED_FILES),
            "models/${key}/calibration.json",
        ],
        "params": [{p.data: None}],
        "outs": [
            "predictions/${key}",
            {"results/${key}/eval.json": {"cache": False}},
            {"metrics/${key}/eval.json": {"cache": False}},
        ],
        "plots": [
            {
                "plots/${key}/confusion.json": {
                    "template": "confusion",
                    "x": "predicted",
                    "y": "actual",
                    "cache": False,
                }
            },
            {"plots/${key}/reliability.json": {"x": "confidence", "y": "accuracy", "cache": False}},
            {"plots/${key}/coverage.json": {"x": "coverage", "y": "accuracy", "cache": False}},
            {
                "plots/${key}/per_intent.json": {
                    "template": "bar_horizontal_sorted",
                    "x": "f1",
                    "y": "intent",
                    "cache": False,
                }
            },
        ],
    }


def run(ctx: Context) -> Result:
    from reprogate.predict.evaluate import evaluate, summary

    return Result(summary(ctx.model, evaluate(ctx.root, ctx.model)))
