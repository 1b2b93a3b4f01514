"""The gates judged again against the production record a promotion just wrote.

Every gate depends on models/production.json (a candidate must not be worse than production),
so a promotion that only committed the record would leave each built gate stale in `dvc status`,
and the next `reprogate status` or promote would find the pipeline out of date. Instead the
promotion commit carries the gates' new verdicts: each gate a pipeline of this project has built
(its dvc.lock holds the stage) runs again, alone (`dvc repro --single-item`), and the files it
rewrote (its records, its headline metrics, the lock) are committed with the record. Running
it again is harmless: the same record and evidence give the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from reprogate.specs.pipeline import PARTS
from reprogate.utils import dvc_cli, git
from reprogate.utils.pause import pause_if

GATE = "gate"


def built_gates(root: Path) -> list[str]:
    """`dvc repro` targets of the gates this project has built, default first."""
    out = []
    for part in PARTS:
        pipeline, lock = dvc_cli.pipeline_file(part), dvc_cli.pipeline_file(part, dvc_cli.LOCK)
        if not (root / pipeline).is_file() or not (root / lock).is_file():
            continue
        try:
            stages = dvc_cli.lock_stages((root / lock).read_bytes())
        except (yaml.YAMLError, AttributeError):
            continue  # a lock DVC cannot read either: `dvc status` names it, promote refused before
        if GATE in stages:
            out.append(GATE if part == "default" else f"{pipeline.as_posix()}:{GATE}")
    return out


def rerun(root: Path) -> list[str]:
    """Each built gate run again on the record just written; the tracked files that changed
    (project-relative), to commit with it."""
    for target in built_gates(root):
        dvc_cli.run(root, "repro", "--single-item", target)
        pause_if("promote:regated")
    prefix = git.prefix(root).strip()
    changed = git.run(root, "diff", "--name-only", "--relative", "HEAD", check=False).splitlines()
    return sorted({p.removeprefix(prefix) for p in changed if p.strip()} - {"models/production.json"})
