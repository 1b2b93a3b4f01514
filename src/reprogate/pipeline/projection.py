"""`reprogate plan` of a whole pipeline: how long `dvc repro` will take here, before it runs.

Each stage that will run (`dvc status`, or every one with --all) is projected from, in order:
this machine's own last run of it (logs/<stage>.jsonl), or the committed stage table beside the
pipeline's dvc.yaml (stage-times.json: one full run's wall times on the machine that wrote it),
scaled by how fast this machine is against that one (a fixed matrix product under the numeric
pin, timed here and there). A training stage is scaled further by its planned updates against
the updates the table measured, so a spec's new `steps` moves its projection. Every stage also
pays a fixed start-up (Python, torch, DVC's hashing), measured as what the run took beyond the
stages' own wall times. `reprogate plan --write-table` records the table after a full run.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import yaml

from reprogate.records.base import Record, load, write
from reprogate.records.runlog import RunLogEntry
from reprogate.utils import dvc_cli, git, jsonl, paths
from reprogate.utils.errors import UserError

TABLE = "stage-times.json"


class StageTime(Record):
    seconds: float  # the stage's own wall time (its run log's wall_s)
    updates: int | None = None  # a training stage's optimizer updates in that run


class Steps(Record):
    """metrics/<m>/train.json as the table reads it: the optimizer updates the run made."""

    steps: int


class StageTable(Record):
    """stage-times.json beside a dvc.yaml: one full run's stage times, and the machine's speed."""

    commit: str | None
    measured_at: str
    cpu: str
    cores: int
    probe_s: float  # probe() on that machine
    startup_s: float  # per stage: the run's wall time beyond the stages' own, divided by their count
    stages: dict[str, StageTime]


def probe(reps: int = 24) -> float:
    """Seconds of a fixed float workload under this process's numeric pin: the speed ratio of two
    machines for the stages' work (their time is matrix products, mostly)."""
    import torch

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(512, 384, generator=g), torch.randn(384, 1536, generator=g)
    a @ b  # first-call costs
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return time.perf_counter() - start


def instances(root: Path, dvc_yaml: Path) -> list[str]:
    """Every stage address of a dvc.yaml, in its order (train@ngram, ..., gate)."""
    stages = yaml.safe_load((root / dvc_yaml).read_text())["stages"]
    return [
        a for n, s in stages.items() for a in ([f"{n}@{k}" for k in s["foreach"]] if "foreach" in s else [n])
    ]


def stale(root: Path, dvc_yaml: Path) -> set[str]:
    """The addresses `dvc repro` would run now (DVC names an experiments stage with its file)."""
    said = json.loads(dvc_cli.run(root, "status", "--json", str(dvc_yaml)) or "{}")
    return {k.rpartition(":")[2] for k in said}


def _last_run(root: Path, address: str) -> float | None:
    log = root / paths.run_log(address)
    if not log.is_file():
        return None
    lines = [RunLogEntry.model_validate(x) for x in jsonl.read_jsonl(log)]
    wall = lines[-1].telemetry.get("wall_s") if lines else None
    return float(wall) if isinstance(wall, int | float) else None


def _updates(root: Path, address: str) -> int | None:
    """A training stage's updates as its spec now plans them (None when only a run can say)."""
    stage, _, model = address.partition("@")
    if stage != "train":
        return None
    from reprogate.specs.loader import load_spec
    from reprogate.specs.model import ModelSpec
    from reprogate.train.run import prepared_steps

    spec_path = root / paths.model_spec(model)
    spec = load_spec(spec_path, ModelSpec)
    return spec.steps if spec.steps is not None else prepared_steps(root, spec, spec_path)


@dataclass(frozen=True)
class Projected:
    address: str
    seconds: float | None
    source: str


def project(root: Path, dvc_yaml: Path, everything: bool) -> tuple[list[Projected], StageTable | None, float]:
    table_path = root / dvc_yaml.parent / TABLE
    table = (
        load(table_path, StageTable, "rewrite it: `reprogate plan --write-table`")
        if table_path.is_file()
        else None
    )
    factor = probe() / table.probe_s if table else 1.0  # torch and the probe only when there is a table
    todo = instances(root, dvc_yaml)
    if not everything:
        todo = [a for a in todo if a in stale(root, dvc_yaml)]
    out = []
    for a in todo:
        here = _last_run(root, a)
        known = table.stages.get(a) if table else None
        if here is not None:
            out.append(Projected(a, here + (table.startup_s if table else 0.0), "its last run here"))
        elif known is not None:
            seconds, why = known.seconds * factor, f"table x{factor:.2f}"
            now = _updates(root, a) if known.updates else None
            if now and now != known.updates:
                seconds, why = seconds * now / known.updates, f"{why}, {now} updates / {known.updates}"
            out.append(Projected(a, seconds + table.startup_s * factor, why))
        else:
            out.append(Projected(a, None, "never measured: `reprogate plan SPEC` measures a model"))
    return out, table, factor


def describe(root: Path, dvc_yaml: Path, everything: bool) -> str:
    rows, table, factor = project(root, dvc_yaml, everything)
    which = "all, as `dvc repro -f`" if everything else "those `dvc status` names"
    if not rows:
        return f"plan: {dvc_yaml}: nothing to run, every stage is up to date"
    total = sum(r.seconds or 0.0 for r in rows)
    unknown = [r.address for r in rows if r.seconds is None]
    lines = [
        f"  {r.address:<34} {'?' if r.seconds is None else f'{r.seconds:7.0f} s'}  {r.source}" for r in rows
    ]
    against = (
        f"table: {table.cpu}, {table.cores} cores, at {(table.commit or '?')[:12]}; "
        f"this machine takes {factor:.2f}x its time"
        if table
        else f"no {TABLE} beside {dvc_yaml}: only stages run here before are projected"
    )
    head = f"plan: {dvc_yaml}: {len(rows)} stages ({which}), about {total / 60:.1f} min on this machine" + (
        f" plus {len(unknown)} never measured" if unknown else ""
    )
    return "\n".join([head, *lines, f"  ({against})"])


def write_table(root: Path, dvc_yaml: Path, run_seconds: float) -> str:
    """stage-times.json from this machine's run logs of every stage of `dvc_yaml`, after a full
    run that took `run_seconds` (the wall time of `dvc repro -f`)."""
    addresses = instances(root, dvc_yaml)
    measured = {a: _last_run(root, a) for a in addresses}
    missing = [a for a, s in measured.items() if s is None]
    if missing:
        raise UserError(
            f"plan --write-table: no run log of {', '.join(missing)} in logs/; run the whole pipeline "
            f"first (`dvc repro -f {dvc_yaml}`), then write the table with its wall time."
        )
    stages = {}
    for a, s in measured.items():
        record = root / paths.metrics_dir(a.partition("@")[2]) / "train.json"
        # A classifier's TrainRecord and a language model's LmTrainRecord both count `steps`.
        steps = load(record, Steps, "rerun it").steps if a.startswith("train@") and record.is_file() else None
        stages[a] = StageTime(seconds=round(s, 2), updates=steps)
    own = sum(s.seconds for s in stages.values())
    table = StageTable(
        commit=git.run(root, "rev-parse", "HEAD") if git.git_dir(root) else None,
        measured_at=datetime.now(UTC).date().isoformat(),
        cpu=_cpu(),
        cores=os.cpu_count() or 1,
        probe_s=round(probe(), 4),
        startup_s=round(max(run_seconds - own, 0.0) / len(stages), 2),
        stages=stages,
    )
    write(root / dvc_yaml.parent / TABLE, table)
    return f"plan: wrote {dvc_yaml.parent / TABLE} ({len(stages)} stages, {run_seconds:.0f} s in all)"


def _cpu() -> str:
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()
