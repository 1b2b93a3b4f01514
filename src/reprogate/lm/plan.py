"""`reprogate plan SPEC --write`: a time budget turned into a number of updates, once, on purpose.

`budget.train_minutes: 5` means "as many updates as fit in five minutes of training here". That
number must not depend on how busy the machine is when `dvc repro` runs, or two reruns would
train different models. So it is measured here, on request only: real updates of the real
model on the spec's device (after warm-up), and a real checkpoint write; then
steps = floor(train_minutes * 60 / (seconds per update + checkpoint seconds / every_steps)).
The tokenizer and the validation points are not training and are not counted. The result is
written to specs/models/<m>.plan.yaml, which is committed and is a DVC param of train@<m>.
"""

from __future__ import annotations

import datetime as dt
import math
import platform
import socket
from pathlib import Path

import torch
import yaml

from reprogate.lm.training import LmSetup, speed_key
from reprogate.specs.lm import PlanSpec
from reprogate.train.plan import measure
from reprogate.train.runs import Paths
from reprogate.utils import paths as project
from reprogate.utils.errors import UserError

HEADER = (
    "# Written by `reprogate plan {spec} --write` (measured on this machine; see docs/language-models.md).\n"
    "# train@{name} trains exactly `steps` updates: edit nothing here; measure again with --write.\n"
)


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_plan(root: Path, spec_path: Path, timed: int = 30, max_seconds: float = 40.0) -> str:
    name = spec_path.stem
    setup = LmSetup(root, Paths.for_model(root, name, spec_path), planning=True)
    spec = setup.spec
    if spec.budget.train_minutes is None:
        raise UserError(
            f"{spec_path}: --write fixes the updates of a budget.train_minutes run, and this spec gives "
            "steps or epochs; set budget.train_minutes (and remove steps/epochs), or plan without --write."
        )
    m = measure(setup, warmup=3, timed=timed, max_seconds=max_seconds)
    per_update = m.update_s + m.checkpoint_s / spec.checkpoint.every_steps
    steps = max(1, math.floor(spec.budget.train_minutes * 60 / per_update))
    plan = PlanSpec(
        kind="plan",
        model=name,
        train_minutes=spec.budget.train_minutes,
        speed_key=speed_key(spec),
        steps=steps,
        measured={
            "update_s": round(m.update_s, 6),
            "checkpoint_s": round(m.checkpoint_s, 4),
            "updates_timed": max(1, m.measured_updates),
            "tokens_per_s": round(setup.tokens_per_update() / m.update_s, 1),
            "device": m.device,
            "host": socket.gethostname(),
            "cpu": _cpu(),
            "threads": spec.threads,
            "torch": torch.__version__,
            "at": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        },
    )
    out = root / project.plan_file(name)
    shown = spec_path.relative_to(root) if spec_path.is_relative_to(root) else spec_path
    body = yaml.safe_dump(plan.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
    out.write_text(HEADER.format(spec=shown, name=name) + body)
    return (
        f"plan: {name}: {m.update_s * 1000:.1f} ms per update ({m.measured_updates} timed) + a checkpoint "
        f"every {spec.checkpoint.every_steps} ({m.checkpoint_s:.2f} s) on {m.device} -> {steps} updates in "
        f"{spec.budget.train_minutes:g} min ({plan.measured.tokens_per_s:,.0f} tokens/s); wrote "
        f"{out.relative_to(root)}: commit it (dvc repro then trains exactly these steps)"
    )
