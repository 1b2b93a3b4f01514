"""Stage `resume_check@m`: kill a real training process, resume it, prove nothing changed.

1. reference: the real `reprogate stage train` entry point, as a child process, runs a short
   version of the spec (resume_check.steps updates, a checkpoint every checkpoint_every)
   to the end without interruption;
2. killed: the same command is started again in a fresh folder; when it reports that it has
   finished update `kill_after` it is sent SIGKILL (no clean-up, no atexit, nothing flushed);
3. resumed: the same command again, on the killed run's folder: it resumes from the last
   committed checkpoint and runs to the end;
4. the final full states of reference and resumed runs are compared field by field.
On CPU the tolerance is zero: every tensor must be bitwise equal.
With `resume_check.kill_rank`, step 2 kills only that rank and step 3 is the engine's own: the
elastic agent or Ray Train restarts the worker group, which resumes by itself, and the same
command runs to the end.
"""

from __future__ import annotations

from typing import Any

from reprogate.pipeline.context import Context, Result, trained_families, union
from reprogate.specs.pipeline import Pipeline

PER_MODEL = "trained"
NUMERIC = True  # its outputs are floats: it reruns when params.yaml's numerics change
# It runs the train stage as child processes: that stage's code is this one's too.
RUNS = ("train",)


def dvc(p: Pipeline) -> dict[str, Any]:
    return {
        "deps": union(f.inputs for f in trained_families(p.models)),
        "params": [{"specs/models/${key}.yaml": None}],
        "outs": [
            {"results/${key}/resume.json": {"cache": False}},
            {"metrics/${key}/resume.json": {"cache": False}},
        ],
    }


def run(ctx: Context) -> Result:
    from reprogate.train.resume_check import check, summary

    r = check(ctx.root, ctx.model, ctx.log)
    return Result(summary(ctx.model, r), telemetry={"device": r["device"]})
