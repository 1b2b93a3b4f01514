"""Stage `code`: each stage's code identity, written to code/<stage>.json.

It runs on every `dvc repro` (always_changed) in about a second and rewrites a file only when
what its code means changed; every other stage depends on its own file instead of its source
files. So DVC's own comparison decides, for plain `dvc repro` as much as for make: a comment or
a docstring leaves every file as it was, a real change reruns the stages that run the module.
"""

from __future__ import annotations

from typing import Any

from reprogate.pipeline.context import Context, Result
from reprogate.pipeline.kinds import KINDS
from reprogate.records import code
from reprogate.records.base import dumps, parse
from reprogate.specs.pipeline import Pipeline, pipeline_kind
from reprogate.utils import paths

PER_MODEL = None
PINNED = False  # writes no float: it needs neither torch nor the numeric pin


def _stages(kind: str) -> list[str]:
    return [s for s in KINDS[kind].stages if s != "code"]


def dvc(p: Pipeline) -> dict[str, Any]:
    return {
        "deps": [],
        "outs": [{str(paths.code_identity(s)): {"cache": False, "persist": True}} for s in _stages(p.kind)],
        "always_changed": True,
    }


def run(ctx: Context) -> Result:
    changed = []
    for stage in _stages(pipeline_kind(ctx.root)):
        f = ctx.root / paths.code_identity(stage)
        saved, _ = parse(f, code.CodeIdentity)
        new = code.current(stage)
        if saved is None or saved.identity != new.identity:
            moved = [m.rpartition(".")[2] for m in code.changed(saved, new)]
            what = f"{', '.join(moved[:3])}{', ...' if len(moved) > 3 else ''}" if saved else "new"
            changed.append(f"{stage} ({what})")
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(dumps(new))
    said = f"{len(changed)} changed: {'; '.join(changed)}" if changed else "every stage's code as before"
    return Result(f"code: {said}")
