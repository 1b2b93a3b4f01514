"""Stage `code`: each stage's code identity, written to code/<stage>.json, and for a stage that
runs for each model, to code/<stage>/<family>.json, one per model family the project uses.

It runs on every `dvc repro` (always_changed) in about a second and rewrites a file only when
what its code means changed; every other stage depends on its own file instead of its source
files. So DVC's own comparison decides, for plain `dvc repro` as much as for make: a comment or
a docstring leaves every file as it was, a real change reruns the stages that run the module,
and a change to one family's code reruns that family's stages (and what consumes their outputs).
The default pipeline's stage writes the experiments' files too: they run the same stages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reprogate.pipeline.context import Context, Result, runs_for
from reprogate.pipeline.kinds import KINDS
from reprogate.records import code
from reprogate.records.base import dumps, parse
from reprogate.specs.pipeline import Pipeline, load_pipeline
from reprogate.utils import imports, paths
from reprogate.utils.errors import UserError

PER_MODEL = None
PINNED = False  # writes no float: it needs neither torch nor the numeric pin


def built_from(p: Pipeline, name: str) -> list[str]:
    """Every candidate model `name` is built from, all the way down, depth first (an export's
    source, then that ensemble's members)."""
    spec = p.models[name]
    return [m for s in spec.family_def.sources(spec) for m in (s, *built_from(p, s))]


def wanted(p: Pipeline) -> dict[Path, tuple[str, str | None, tuple[str, ...]]]:
    """Every identity file the pipeline's stages depend on: path -> (stage, family, under)."""
    out: dict[Path, tuple[str, str | None, tuple[str, ...]]] = {}
    for stage in KINDS[p.kind].stages[1:]:  # all but `code` itself
        which = imports.constant(f"{imports.PACKAGE}.pipeline.stages.{stage}", "PER_MODEL")
        if which is None:
            out[paths.code_identity(stage)] = (stage, None, ())
            continue
        groups: dict[str, tuple[str, set[str]]] = {}  # family's name -> (as specs name it, under)
        for n, spec in p.models.items():
            if not runs_for(stage, which, spec):  # type: ignore[arg-type]
                continue
            fam, below = groups.setdefault(spec.family_def.name, (spec.family, set()))
            if fam != spec.family:
                raise UserError(
                    f"specs/models/{n}.yaml: family '{spec.family}' is named '{spec.family_def.name}', "
                    f"as family '{fam}' is; two families of one project need two names (the name of "
                    "their spec section and of code/<stage>/<name>.json)"
                )
            below.update(p.models[m].family for m in built_from(p, n))
        for name, (fam, below) in sorted(groups.items()):
            out[paths.code_identity(stage, name)] = (stage, fam, tuple(sorted(below)))
    return out


def _all_models(root: Path) -> Pipeline:
    """The default pipeline with the experiments' models too: one code stage serves both."""
    return load_pipeline(root, "experiments")


def dvc(p: Pipeline) -> dict[str, Any]:
    files = wanted(_all_models(p.root))
    return {
        "deps": [],
        "outs": [{f.as_posix(): {"cache": False, "persist": True}} for f in files],
        "always_changed": True,
    }


def run(ctx: Context) -> Result:
    changed = []
    files = wanted(_all_models(ctx.root))
    for rel, (stage, fam, under) in files.items():
        f = ctx.root / rel
        saved, _ = parse(f, code.CodeIdentity)
        new = code.current(stage, fam, under)
        if saved is None or saved.identity != new.identity or saved.under != new.under or saved.family != fam:
            moved = [m.rpartition(".")[2] for m in code.changed(saved, new)]
            what = f"{', '.join(moved[:3])}{', ...' if len(moved) > 3 else ''}" if saved else "new"
            changed.append(f"{rel.with_suffix('').relative_to(paths.CODE).as_posix()} ({what})")
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(dumps(new))
    folder = ctx.root / paths.CODE
    for left in sorted(set(code.saved_files(ctx.root)) - {ctx.root / f for f in files}):
        left.unlink()  # a stage or family the project no longer runs
        changed.append(f"{left.relative_to(folder).with_suffix('').as_posix()} (gone)")
    said = f"{len(changed)} changed: {'; '.join(changed)}" if changed else "every stage's code as before"
    return Result(f"code: {said}")
