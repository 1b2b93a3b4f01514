"""The pipeline stages, one module each; `run` is what `reprogate stage NAME` (and so DVC) calls.

Kept apart from the CLI so that DVC's dependencies of a stage are exactly the modules it runs:
a change to another command (serve, predict) does not invalidate the pipeline.
"""

from __future__ import annotations

from pathlib import Path

from reprogate.errors import UserError

NAMES = ("prepare", "features", "train", "combine", "calibrate", "evaluate", "resume_check", "gate")


def run(
    name: str,
    root: Path,
    model: str | None = None,
    spec: Path | None = None,
    run_dir: Path | None = None,
    work_dir: Path | None = None,
    skip_plan: bool = False,
) -> str:
    """Run one stage and return its one-line summary."""
    from reprogate.pipeline import load_pipeline

    if name == "prepare":
        from reprogate.stages import prepare

        return prepare.summary(prepare.prepare(spec or root / load_pipeline(root).data, root))
    if name == "gate":
        from reprogate.stages import gate

        pipe = load_pipeline(root)
        return gate.summary(gate.run(root, list(pipe.models), root / pipe.gate))
    if not model:
        raise UserError(f"stage {name} needs a model name, e.g. `reprogate stage {name} ngram`.")
    if name == "features":
        from reprogate.stages import features

        return features.run(root, model)
    if name == "train":
        from reprogate.stages import train

        paths = train.Paths.for_model(root, model, spec, run_dir, work_dir)
        processes = train.processes_to_launch(paths)
        if processes:  # this process starts the ranks, each of which runs this same command
            argv = ["stage", "train", model, "--spec", str(paths.spec)]
            argv += [f"--{k}-dir={v}" for k, v in (("run", run_dir), ("work", work_dir)) if v]
            from reprogate import distributed

            return distributed.launch(root, argv + ["--skip-plan"] * skip_plan, processes, paths.spec)
        return train.summary(model, train.run(root, paths, skip_plan=skip_plan))
    if name == "combine":
        from reprogate.stages import combine

        return combine.summary(model, combine.run(root, model))
    if name == "calibrate":
        from reprogate.stages import calibrate

        return calibrate.summary(model, calibrate.run(root, model, root / load_pipeline(root).gate))
    if name == "evaluate":
        from reprogate.stages import evaluate

        return evaluate.summary(model, evaluate.run(root, model))
    if name == "resume_check":
        from reprogate.stages import resume_check

        return resume_check.summary(model, resume_check.run(root, model))
    raise UserError(f"unknown stage '{name}'; stages are {', '.join(NAMES)}")
