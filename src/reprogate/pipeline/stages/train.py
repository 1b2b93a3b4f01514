"""Stage `train@m`: build a run, fit it with auto-resume, export the model, record the run.

runs/<m>/checkpoints/  full-state checkpoints: the run's working state, not a DVC output, so
                       DVC never deletes them (a rerun resumes) nor caches or pushes them
models/<m>/            weights (safetensors), config, labels, fingerprint: what predict loads
metrics/<m>/train.json steps, epochs, final loss, validation accuracy (the same on every rerun)
plots/<m>/train.tsv    step, loss, learning rate (one value per step: what the model kept)
runs/<m>/updates/<k>.jsonl  every update as it happened, a resumed run's repeats included
                       (k: the run's train key; read by the registry's metrics_raw)
logs/train@<m>.jsonl   a line per run: wall time, examples/s, peak memory, device, projected vs
                       actual, resumed from (git-ignored telemetry, see runlog.py; written by
                       runner.run from this stage's Result)
A spec with `processes: N` starts N ranks of this same command under the elastic agent, or,
with `executor: ray`, runs `train` on N Ray Train workers; rank 0 speaks for the run. The run
itself is train/job.py's, built by the kind's setup class.
"""

from __future__ import annotations

from typing import Any

from reprogate.pipeline.context import Context, Result
from reprogate.records.lm import LmTrainRecord
from reprogate.records.train import TrainRecord
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from reprogate.specs.pipeline import Pipeline, augments
from reprogate.utils.paths import AUGMENTED, LM_FILES, TRAIN_FILES

PER_MODEL = "trained"
NUMERIC = True  # its outputs are floats: it reruns when params.yaml's numerics change
RECORD_FIELDS = {*TrainRecord.model_fields, *LmTrainRecord.model_fields}


def dvc(p: Pipeline) -> dict[str, Any]:
    if p.kind == "lm":
        return {
            "deps": ["data/tokens/${key}"],
            # The committed plan fixes a budget.train_minutes run's steps (the spec itself otherwise).
            "params": [{"specs/models/${key}.yaml": None}, {"${item.plan}": None}],
            "outs": [
                *(f"models/${{key}}/{f}" for f in LM_FILES),
                {"metrics/${key}/train.json": {"cache": False}},
            ],
            "plots": [
                {"plots/${key}/train.tsv": {"x": "step", "y": "loss", "cache": False}},
                *(
                    {f"plots/${{key}}/validation_by_{x}.tsv": {"x": x, "y": "nats_per_token", "cache": False}}
                    for x in ("tokens", "seconds")
                ),
            ],
        }
    augmented = [AUGMENTED.parent.as_posix()] if augments(p) else []
    return {
        "deps": ["data/prepared", *augmented, "data/features/${key}"],
        "params": [{"specs/models/${key}.yaml": None}],
        "outs": [
            *(f"models/${{key}}/{f}" for f in TRAIN_FILES),
            {"metrics/${key}/train.json": {"cache": False}},
        ],
        "plots": [{"plots/${key}/train.tsv": {"x": "step", "y": "loss", "cache": False}}],
    }


def _setup_class(spec: ModelSpec) -> type:
    """What builds a run of this spec's kind (train/job.py runs any of them)."""
    if spec.family == "causal_lm":
        from reprogate.lm.training import LmSetup

        return LmSetup
    from reprogate.train.run import Setup

    return Setup


def run(ctx: Context) -> Result:
    from reprogate.train import distributed, ray_engine
    from reprogate.train.job import ray_rank, summary, train
    from reprogate.train.run import Paths, processes_to_launch

    paths = Paths.for_model(ctx.root, ctx.model, ctx.spec, ctx.run_dir, ctx.work_dir)
    spec = load_spec(paths.spec, ModelSpec)
    setup = _setup_class(spec)
    if spec.executor == "ray":
        args = (ctx.root.resolve(), paths, setup, ctx.skip_plan)
        m = ray_engine.launch(spec, paths.spec, paths.run, ray_rank, args)
    elif processes := processes_to_launch(paths):  # this process starts the ranks, each of which
        argv = ["stage", "train", ctx.model, "--spec", str(paths.spec)]  # runs this same command
        argv += [f"--{k}-dir={v}" for k, v in (("run", ctx.run_dir), ("work", ctx.work_dir)) if v]
        argv += ["--skip-plan"] * ctx.skip_plan
        return Result(distributed.launch(ctx.root, argv, processes, paths.spec, spec.max_restarts))
    else:
        m = train(ctx.root, paths, setup, ctx.skip_plan, ctx.log)
    # Everything but the tracked record is telemetry (rank > 0 returns {"rank": r}, logs nothing).
    return Result(
        summary(ctx.model, m),
        telemetry={k: v for k, v in m.items() if k not in RECORD_FIELDS},
    )
