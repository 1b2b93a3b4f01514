"""Stage `calibrate@m`: temperature scaling and the routing policy, on calibration data only.

The temperature minimises the negative log-likelihood of the calibration partition (carved
out of train by `prepare`, never seen in training). The routing policy, a confidence
threshold and a top-1/top-2 margin, is the one with the most coverage on the calibration
partition whose wrong-action rate there and false-positive action rate on the data spec's
out-of-scope sets marked `use: calibrate` (CLINC150 oos_val) meet the gate's limits, with
an upper confidence bound (gate spec `policy_fit.confidence`) where the data can show one.
The test set and the evaluation-only sets are never read here.
"""

from __future__ import annotations

from typing import Any

from reprogate.pipeline.context import Context, Result
from reprogate.specs.pipeline import Pipeline, load_pipeline
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
        ],
        # The routing policy is fitted to the gate's action limits and the data's OOS sets.
        # Whole files: a spec may leave those keys to their defaults.
        "params": [{p.gate: None}, {p.data: None}],
        "outs": ["models/${key}/calibration.json"],
    }


def run(ctx: Context) -> Result:
    from reprogate.predict.calibrate import calibrate, summary

    gate = ctx.root / load_pipeline(ctx.root).gate
    return Result(summary(ctx.model, calibrate(ctx.root, ctx.model, gate)))
