"""`reprogate status`: is each pipeline built and up to date? One line each.

`dvc status` alone lists every pipeline of the repository (the experiments too, which `make repro`
does not build) and stage `code`, which runs on every repro by design. This says, per pipeline,
which stages are out of date or not built, and the command that builds them; its exit status is
the default pipeline's (0: up to date).
"""

from __future__ import annotations

from pathlib import Path

from reprogate.pipeline.compile import parts
from reprogate.records import code
from reprogate.utils import dvc_cli, paths

BUILDS = {"default": "make repro", "experiments": "make repro-experiments"}


def status(root: Path) -> tuple[list[str], bool]:
    """(a line per pipeline, whether the default one is up to date)."""
    lines, clean = [], True
    moved = code.stale(root)  # code whose committed identity is not what it means: dvc cannot tell yet
    for part in parts(root):
        target = dvc_cli.pipeline_file(part)
        stale = sorted(dvc_cli.status(root, target))
        if part == "default":
            stale = sorted({*stale, *(f"{s} (its code)" for s in moved)})
            clean = not stale
        if not stale:
            lines.append(f"status: {part} pipeline ({target}): up to date")
            continue
        shown = ", ".join(stale[:5]) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
        lines.append(
            f"status: {part} pipeline ({target}): {len(stale)} stage(s) out of date or not built "
            f"({shown}); `{BUILDS[part]}` builds them"
        )
    if (root / paths.EXPERIMENTS).is_dir() and "experiments" not in parts(root):
        lines.append("status: experiments/ is left from experiments params.yaml no longer lists")
    return lines, clean
