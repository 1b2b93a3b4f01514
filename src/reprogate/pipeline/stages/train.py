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

from reprogate.pipeline.context import Context, Result, trained_families, union
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from reprogate.specs.pipeline import Pipeline, augments
from reprogate.utils.paths import AUGMENTED

PER_MODEL = "trained"
NUMERIC = True  # its outputs are floats: it reruns when params.yaml's numerics change


def dvc(p: Pipeline) -> dict[str, Any]:
    declared = trained_families(p.models)
    params: list[dict] = [{"specs/models/${key}.yaml": None}]
    if any(f.planned for f in declared):  # its committed plan fixes a budget run's steps
        params.append({"${item.plan}": None})
    loss = {"plots/${key}/train.tsv": {"x": "step", "y": "loss", "cache": False}}
    return {
        "deps": [*union(f.inputs for f in declared), *([AUGMENTED.parent.as_posix()] if augments(p) else [])],
        "params": params,
        "outs": [
            *(f"models/${{key}}/{f}" for f in union(f.files for f in declared)),
            {"metrics/${key}/train.json": {"cache": False}},
        ],
        "plots": [loss, *union(f.plots for f in declared)],
    }


def run(ctx: Context) -> Result:
    from reprogate.train import distributed, ray_engine
    from reprogate.train.job import ray_rank, summary, train
    from reprogate.train.runs import Paths, processes_to_launch

    paths = Paths.for_model(ctx.root, ctx.model, ctx.spec, ctx.run_dir, ctx.work_dir)
    spec = load_spec(paths.spec, ModelSpec)
    setup = spec.family_def.part("setup")  # what builds a run of it (train/job.py runs any)
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
        telemetry={k: v for k, v in m.items() if k not in setup.record.model_fields},
    )
