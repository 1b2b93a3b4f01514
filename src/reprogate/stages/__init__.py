"""The pipeline's stages, in the order DVC runs them: the one registry of their names.

Each is stages/<name>.py with PER_MODEL, dvc() and run() (see pipeline.py). `reprogate stage
NAME` imports only that stage's module, so that the code DVC lists as its dependencies (derived
from its imports by `reprogate compile`) is exactly the code it runs.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from reprogate.errors import UserError
from reprogate.pipeline import Context, Result

NAMES = ("prepare", "features", "train", "combine", "calibrate", "evaluate", "resume_check", "gate")


def module(name: str) -> ModuleType:
    if name not in NAMES:
        raise UserError(f"unknown stage '{name}'; stages are {', '.join(NAMES)}")
    return importlib.import_module(f"{__name__}.{name}")


def run(name: str, ctx: Context) -> Result:
    """Run one stage: its Result ends with the stage's one-line summary."""
    stage = module(name)
    if stage.PER_MODEL and not ctx.model:
        raise UserError(f"stage {name} needs a model name, e.g. `reprogate stage {name} ngram`.")
    return stage.run(ctx)
