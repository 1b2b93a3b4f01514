"""`reprogate status`: is each pipeline built and up to date? One line each.

`dvc status` alone lists every pipeline of the repository (the experiments too, which `make repro`
does not build) and stage `code`, which runs on every repro by design. This says, per pipeline,
which stages are out of date (an input, a parameter, the command or their code changed) and which
are only not built here (outputs that are not in this workspace or its cache, as on a fresh
clone: the committed lock still describes them), and the command that builds them; its exit
status is the default pipeline's (0: up to date and built).
"""

from __future__ import annotations

from pathlib import Path

from reprogate.pipeline.compile import parts
from reprogate.records import code
from reprogate.utils import dvc_cli, paths

BUILDS = {"default": "make repro", "experiments": "make repro-experiments"}
MISSING = {"deleted", "not in cache"}  # what dvc says of a file that is not here


def _locks(root: Path) -> dict[str, dict[str, dict]]:
    """Per pipeline, every stage of its dvc.lock, by the address `dvc status` gives it."""
    out = {}
    for part in parts(root):
        target = dvc_cli.pipeline_file(part)
        lock = root / target.with_suffix(".lock")
        prefix = "" if part == "default" else f"{target.as_posix()}:"
        text = lock.read_text() if lock.is_file() else ""
        out[part] = {prefix + name: s for name, s in dvc_cli.lock_stages(text).items()}
    return out


def _only_missing(changes: list, produced: list[str]) -> bool:
    """Whether every change dvc reports is a file not here that a stage writes: outputs not built
    (or not in the cache), and inputs that are such outputs. Anything else is out of date."""
    for entry in changes:
        if not isinstance(entry, dict):
            return False  # "changed command", "always changed"
        for key, files in entry.items():
            if key not in ("changed outs", "changed deps") or not isinstance(files, dict):
                return False
            for path, what in files.items():
                if not isinstance(what, str) or what not in MISSING:
                    return False  # a parameter's values come as a dict of what changed
                if key == "changed deps" and not any(path == o or path.startswith(o + "/") for o in produced):
                    return False  # an input nothing builds is gone: building would not bring it back
    return True


def _moved(root: Path, stages: dict[str, dict]) -> set[str]:
    """The stages whose code no longer means what their committed identity says (a plain `git
    status` cannot tell, and DVC only finds out when stage `code` has run)."""
    files = {f"{paths.CODE}/{identity}.json" for identity in code.stale(root)}
    return {name for name, s in stages.items() if files & {d["path"] for d in s.get("deps", [])}}


def _listed(names: list[str], target: Path) -> str:
    """The first five, without the pipeline file the line already names."""
    names = [n.removeprefix(f"{target.as_posix()}:") for n in names]
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def status(root: Path) -> tuple[list[str], bool]:
    """(a line per pipeline, whether the default one is built and up to date)."""
    lines, clean = [], True
    locks = _locks(root)
    every = {name: s for stages in locks.values() for name, s in stages.items()}
    produced, moved = [o["path"] for s in every.values() for o in s.get("outs", [])], _moved(root, every)
    for part, stages in locks.items():
        target = dvc_cli.pipeline_file(part)
        found = dvc_cli.status(root, target)
        code_moved = moved & stages.keys()
        stale = sorted({*(n for n, c in found.items() if not _only_missing(c, produced)), *code_moved})
        absent = sorted(n for n in found if n not in stale)
        if part == "default":
            clean = not stale and not absent
        if not stale and not absent:
            lines.append(f"status: {part} pipeline ({target}): up to date")
            continue
        said = [f"{n} (its code)" if n in code_moved else n for n in stale]
        told = ([f"{len(stale)} stage(s) out of date ({_listed(said, target)})"] if stale else []) + (
            [f"{len(absent)} stage(s) not built here, inputs as committed ({_listed(absent, target)})"]
            if absent
            else []
        )
        lines.append(f"status: {part} pipeline ({target}): {'; '.join(told)}; `{BUILDS[part]}` builds them")
    if (root / paths.EXPERIMENTS).is_dir() and "experiments" not in parts(root):
        lines.append("status: experiments/ is left from experiments params.yaml no longer lists")
    return lines, clean
