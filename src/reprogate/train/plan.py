"""`reprogate plan SPEC`: run a few real updates, measure, and project the whole run.

The projection is measured, not guessed: seconds per update and per checkpoint write on the
chosen device, peak process memory (RSS) and peak device memory after the first updates,
when model, gradients and optimizer state are all allocated. `train` refuses to start when
the projection exceeds the spec's budget.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from reprogate.records.runlog import peak_rss_gb
from reprogate.runtime.device import device_peak_gb
from reprogate.train import checkpoint, distributed
from reprogate.utils.errors import UserError

# Memory is steady after the first updates; texts longer than those sampled can add a little.
MEMORY_MARGIN = 1.10


@dataclass
class Plan:
    device: str
    total_steps: int
    measured_updates: int
    update_s: float
    checkpoint_s: float
    checkpoints: int
    setup_s: float
    peak_rss_gb: float
    device_peak_gb: float | None
    projected_minutes: float
    projected_memory_gb: float
    budget_minutes: float
    budget_memory_gb: float

    def as_dict(self) -> dict:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}

    def line(self) -> str:
        dev = f", device peak {self.device_peak_gb:.2f} GB" if self.device_peak_gb is not None else ""
        return (
            f"plan: {self.total_steps} steps x {self.update_s * 1000:.1f} ms + {self.checkpoints} "
            f"checkpoints x {self.checkpoint_s:.2f} s + setup {self.setup_s:.1f} s on {self.device} -> "
            f"~{self.projected_minutes:.2f} min, peak memory ~{self.projected_memory_gb:.2f} GB{dev} "
            f"(budget {self.budget_minutes:g} min, {self.budget_memory_gb:g} GB)"
        )


def measure(setup, warmup: int = 2, timed: int = 8, max_seconds: float = 20.0) -> Plan:
    t_setup = time.perf_counter()
    trainer = setup.trainer()
    setup_s = setup.encode_s + (time.perf_counter() - t_setup)
    trainer.fit(max_updates=min(warmup, setup.total_steps), show_progress=False)
    n, start = 0, time.perf_counter()
    while n < timed and trainer.progress.global_step < setup.total_steps:
        trainer.fit(max_updates=1, show_progress=False)
        n += 1
        slow = time.perf_counter() - start > max_seconds
        if trainer.world > 1:  # ranks stop measuring together, or one would wait in an update
            slow = any(distributed.gather(slow, trainer.world))
        if slow:
            break
    update_s = (time.perf_counter() - start) / max(n, 1)
    with tempfile.TemporaryDirectory(prefix="reprogate-plan-") as tmp:
        t = time.perf_counter()
        tensors, meta = trainer.state()
        checkpoint.save(Path(tmp), trainer.progress.global_step, tensors, meta, setup.fingerprint, keep=1)
        ckpt_s = time.perf_counter() - t
    spec = setup.spec
    n_ckpt = setup.total_steps // spec.checkpoint.every_steps + 1
    seconds = setup_s + setup.total_steps * update_s + n_ckpt * ckpt_s
    device_peak = device_peak_gb(setup.device)
    memory = peak_rss_gb() * MEMORY_MARGIN
    del trainer
    return Plan(
        device=str(setup.device),
        total_steps=setup.total_steps,
        measured_updates=n,
        update_s=update_s,
        checkpoint_s=ckpt_s,
        checkpoints=n_ckpt,
        setup_s=setup_s,
        peak_rss_gb=peak_rss_gb(),
        device_peak_gb=device_peak,
        projected_minutes=seconds / 60,
        projected_memory_gb=max(memory, (device_peak or 0.0) * MEMORY_MARGIN),
        budget_minutes=time_limit(spec, getattr(setup, "plan", None)),
        budget_memory_gb=spec.budget.max_memory_gb,
    )


def planned_minutes(spec, committed) -> float:
    """What a committed plan (lm's specs/models/<m>.plan.yaml) measured its updates would take."""
    m = committed.measured
    return committed.steps * (m.update_s + m.checkpoint_s / spec.checkpoint.every_steps) / 60


def time_limit(spec, committed=None) -> float:
    """The minutes a run may train: budget.max_minutes, or for a planned run max_slowdown x its
    plan's minutes, so that a machine that much slower than the one that planned it still trains
    the committed updates (a fixed limit would cut the same run short on a slower CPU)."""
    if committed is None:
        return spec.budget.max_minutes
    return spec.budget.max_slowdown * planned_minutes(spec, committed)


def _too_slow(spec, spec_path: Path, committed, update_s: float, name: str) -> str:
    m = committed.measured
    project = Path(spec_path).resolve().parent.parent.parent
    return (
        f"this machine runs {update_s / m.update_s:.1f}x slower than the committed plan measured "
        f"({update_s * 1000:.1f} ms per update here, {m.update_s * 1000:.1f} ms on {m.cpu}, {m.threads} "
        f"threads, {m.at[:10]}), so its {committed.steps} updates need ~"
        f"{committed.steps * update_s / 60:.1f} min, past budget.max_slowdown {spec.budget.max_slowdown:g} "
        f"x the planned {planned_minutes(spec, committed):.1f} min. To train the committed plan here, "
        f"raise budget.max_slowdown; to fit train_minutes on this machine instead, measure it again: "
        f"`cd {project} && reprogate plan {name} --write` and commit the plan (another plan is another run)"
    )


def check_budget(plan: Plan, spec, spec_path: Path, committed=None, name: str = "") -> None:
    over = []
    limit = time_limit(spec, committed)
    # Like with like: a committed plan's limit is a multiple of its updates' and checkpoints'
    # minutes (planned_minutes), so its setup is not counted against it; budget.max_minutes
    # bounds the whole run, setup included, as the watchdog counts it.
    setup_min = plan.setup_s / 60 if committed else 0.0
    if plan.projected_minutes - setup_min > limit:
        over.append(
            _too_slow(spec, spec_path, committed, plan.update_s, name)
            if committed
            else f"projected time {plan.projected_minutes:.1f} min exceeds budget.max_minutes {limit:g}"
        )
    if plan.projected_memory_gb > spec.budget.max_memory_gb:
        over.append(
            f"projected peak memory {plan.projected_memory_gb:.2f} GB exceeds budget.max_memory_gb "
            f"{spec.budget.max_memory_gb:g}"
        )
    if over:
        raise UserError(
            f"{spec_path}: training refused before it started: {'; '.join(over)}. Measured on "
            f"{plan.device}: {plan.update_s * 1000:.1f} ms per update, {plan.total_steps} updates. "
            "Raise the budget, or lower steps/epochs, micro_batch or model size, or use a faster device."
        )


class BudgetWatchdog:
    """Trainer callback: stops a run that passes budget.max_minutes or budget.max_memory_gb, with
    its state checkpointed, rather than let it overrun or be killed by the OOM killer; warns once
    when it is already twice its plan. Every rank decides alike (time and memory are gathered),
    so all stop together."""

    def __init__(
        self, spec, spec_path: Path, name: str, plan: Plan | None, device, since: float, saver, log,
        committed=None,
    ):  # fmt: skip
        self.spec, self.spec_path, self.name, self.plan, self.device = spec, spec_path, name, plan, device
        self.since, self.saver, self.log, self.warned = since, saver, log, False
        self.committed, self.first_step, self.first_at = committed, None, 0.0

    def over_budget(self, trainer) -> str | None:
        step, now = trainer.progress.global_step, time.perf_counter()
        if self.first_step is None:
            self.first_step, self.first_at = step, now
        # The whole run (setup included) for budget.max_minutes; a committed plan's limit counts
        # updates only (check_budget), so those are timed from the first update seen.
        minutes, training = (now - self.since) / 60, (now - self.first_at) / 60
        memory = max(peak_rss_gb(), device_peak_gb(self.device) or 0.0)
        if trainer.world > 1:  # the run's time is its slowest rank's, its memory all ranks' together
            seen = distributed.gather((minutes, training, memory), trainer.world)
            minutes, training = max(m for m, _, _ in seen), max(t for _, t, _ in seen)
            memory = sum(g for _, _, g in seen)
        budget = self.spec.budget
        limit = time_limit(self.spec, self.committed)
        if self.committed is not None:
            done = max(step - self.first_step, 1)
            update_s = training * 60 / done
            # After a fair sample, a run that cannot finish within the limit stops now, not later.
            will_pass = done >= 50 and update_s * (trainer.total_steps - step) / 60 + training > limit
            if will_pass or training > limit:
                return _too_slow(self.spec, self.spec_path, self.committed, update_s, self.name)
        elif minutes > limit:
            return f"{minutes:.2f} min of training passed budget.max_minutes {limit:g}"
        if memory > budget.max_memory_gb:
            return f"peak memory {memory:.2f} GB passed budget.max_memory_gb {budget.max_memory_gb:g}"
        if self.plan and not self.warned and minutes > 2 * self.plan.projected_minutes:
            self.warned = True
            self.log(
                f"warning: {minutes:.2f} min in, at update {trainer.progress.global_step} of "
                f"{trainer.total_steps}: already twice the planned {self.plan.projected_minutes:.2f} min for "
                "the whole run (is the machine busier than when it was measured?)"
            )
        return None

    def on_update(self, trainer) -> None:
        step = trainer.progress.global_step
        why = self.over_budget(trainer) if step < trainer.total_steps else None
        if not why:
            return
        self.saver.ensure_saved(trainer)
        plan = self.plan
        planned = (
            f"; the plan projected {plan.projected_minutes:.2f} min, {plan.projected_memory_gb:.2f} GB"
            if plan
            else ""
        )
        raise UserError(
            f"{self.spec_path}: training stopped at update {step} of {trainer.total_steps}: {why}{planned}. "
            f"Update {step} is checkpointed in {self.saver.dir}, and the next run resumes from it "
            f"(`dvc repro`, or `reprogate stage train {self.name}`) with the budget counted afresh; "
            "raise the budget in the spec if the whole run needs more (the checkpoint is kept)."
        )
