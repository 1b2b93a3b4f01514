"""Stage `combine@e`: fit an ensemble's member weights on the calibration partition.

Writes the ensemble's features (members' calibrated log-probabilities for every prepared
split) to data/features/<e>/, and models/<e>/ with the same files as a trained model, so
calibrate@e, evaluate@e and the gate treat it like any other candidate.
"""

from __future__ import annotations

from typing import Any

from reprogate.pipeline.context import Context, Result
from reprogate.specs.pipeline import Pipeline, augments
from reprogate.utils.paths import AUGMENTED, TRAIN_FILES

PER_MODEL = "built"
NUMERIC = True  # its outputs are floats: it reruns when params.yaml's numerics change
MAX_MEMBERS = 4  # DVC templates take scalars only: four member slots, the last member repeated


def dvc(p: Pipeline) -> dict[str, Any]:
    members = [
        f"models/${{item.m{i + 1}}}/{f}"
        for i in range(MAX_MEMBERS)
        for f in ("model.safetensors", "calibration.json")
    ]
    # The augmented rows, whenever the data spec makes them: a neighbour memory may hold them
    # (ensemble.neighbours.augmented), and one declaration serves every ensemble.
    augmented = [AUGMENTED.parent.as_posix()] if augments(p) else []
    return {
        "deps": ["data/prepared", *augmented, *members],
        "params": [{"specs/models/${key}.yaml": None}],
        "outs": [
            "data/features/${key}",
            *(f"models/${{key}}/{f}" for f in TRAIN_FILES),
            {"metrics/${key}/train.json": {"cache": False}},
        ],
    }


def run(ctx: Context) -> Result:
    from reprogate.predict.combine import combine, summary

    return Result(summary(ctx.model, combine(ctx.root, ctx.model)))
