"""`reprogate stage NAME`: the one registry of stage names (each kind's, pipeline/kinds.py) and
the runner around a stage.

Each stage is stages/<name>.py with PER_MODEL, dvc() and run() (see context.py). The runner
imports only that stage's module, so that the code DVC lists as its dependencies (derived from
its imports by `reprogate compile`) is exactly the code that shapes its outputs. The runner
itself is not among them: it checks the numeric pin and appends the run log's line, and
neither changes an output (a gate rule's edit must not retrain every model).
"""

from __future__ import annotations

import importlib
import time
from types import ModuleType

from reprogate.pipeline.context import Context, Result
from reprogate.pipeline.kinds import KINDS
from reprogate.records import runlog
from reprogate.runtime import numerics
from reprogate.utils import paths
from reprogate.utils.errors import UserError

# Each pipeline kind's stages (pipeline/kinds.py); train, resume_check and gate serve both.
PIPELINES = {k.name: k.stages for k in KINDS.values()}
NAMES = tuple(dict.fromkeys(n for names in PIPELINES.values() for n in names))


def module(name: str) -> ModuleType:
    if name not in NAMES:
        raise UserError(f"unknown stage '{name}'; stages are {', '.join(NAMES)}")
    return importlib.import_module(f"reprogate.pipeline.stages.{name}")


def run(name: str, ctx: Context) -> Result:
    """Run one stage: its Result ends with the stage's one-line summary, and the run's
    telemetry is a line of its run log (a training rank other than 0, or the launcher of the
    ranks, says nothing: rank 0 speaks for the run)."""
    stage = module(name)
    if stage.PER_MODEL and not ctx.model:
        raise UserError(f"stage {name} needs a model name, e.g. `reprogate stage {name} ngram`.")
    if getattr(stage, "PINNED", True):  # the pin is in force, or the stage refuses before any work
        numerics.check(ctx.root)
    started = time.perf_counter()
    result = stage.run(ctx)
    if result.summary:
        address = f"{name}@{ctx.model}" if ctx.model else name
        # A run in a folder of its own (resume_check's children, tests) logs there.
        log = ctx.work_dir / "run.jsonl" if ctx.work_dir else ctx.root / paths.run_log(address)
        measured = {
            "wall_s": round(time.perf_counter() - started, 2),
            "peak_rss_gb": round(runlog.peak_rss_gb(), 3),
        }
        runlog.append(ctx.root, log, address, measured | result.telemetry)
    return result
