"""Stage `export@m`: a candidate compiled to ONNX, quantized as its spec says, and scored by the
exported runtime on every prepared split that calibrate@m and evaluate@m read.

Writes models/<m>/ (model.onnx, the members' tokenizers and inputs, labels, config,
fingerprint), data/features/<m>/ (the runtime's logits) and metrics/<m>/export.json (agreement
with the source on validation and test, file size, runtime versions), which the gate reads.
"""

from __future__ import annotations

from typing import Any

from reprogate.pipeline.context import Context, Result
from reprogate.specs.pipeline import Pipeline
from reprogate.utils.paths import EXPORT_FILES, TRAIN_FILES

PER_MODEL = "built"
NUMERIC = True  # its outputs are floats: it reruns when params.yaml's numerics change
MAX_MEMBERS = 4  # as combine: the source's members fill four scalar slots


def dvc(p: Pipeline) -> dict[str, Any]:
    members = [
        f"models/${{item.m{i + 1}}}/{f}"
        for i in range(MAX_MEMBERS)
        for f in ("model.safetensors", "calibration.json", "assets")
    ]
    return {
        "deps": [
            "data/prepared",
            *(f"models/${{item.source}}/{f}" for f in (*TRAIN_FILES, "calibration.json")),
            *members,
        ],
        "params": [{"specs/models/${key}.yaml": None}],
        "outs": [
            "data/features/${key}",
            *(f"models/${{key}}/{f}" for f in EXPORT_FILES),
            {"metrics/${key}/export.json": {"cache": False}},
        ],
    }


def run(ctx: Context) -> Result:
    from reprogate.export.build import export, summary

    return Result(summary(ctx.model, export(ctx.root, ctx.model, ctx.log)))
