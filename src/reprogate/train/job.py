"""One training run of a model spec in this process (a rank of it, with `processes` > 1): the
measured plan, the resume, the fit with its callbacks, then the kind's own export and record.

What differs by kind is the setup class: train/run.py's Setup for a classifier, lm/training.py's
LmSetup for a language model (its validation points, its folder and record); the stage train@m
picks it (pipeline/stages/train.py). This module never imports a kind's code.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from reprogate.records.runlog import UpdateLog, peak_rss_gb
from reprogate.records.train import Fingerprint, train_key
from reprogate.runtime.device import device_peak_gb, rank_and_world
from reprogate.train import checkpoint, distributed, ray_engine
from reprogate.train.plan import BudgetWatchdog, Plan, check_budget, measure
from reprogate.train.runs import Paths
from reprogate.train.trainer import Trainer
from reprogate.utils.console import say
from reprogate.utils.paths import update_log
from reprogate.utils.pause import attempt


def _plan(setup: Any, world: int, log) -> Plan:  # a kind's setup (train/run.Setup, lm/training.LmSetup)
    """The measured projection, one for all ranks (or they would part ways): the slowest rank's
    time, all ranks' memory together. Training is refused here when it exceeds the budget."""
    plan = measure(setup)
    if world > 1:
        plans = distributed.gather(plan, world)
        plan = replace(
            max(plans, key=lambda p: p.projected_minutes),
            projected_memory_gb=sum(p.projected_memory_gb for p in plans),
        )
    check_budget(plan, setup.spec, setup.paths.spec, getattr(setup, "plan", None), setup.paths.name)
    log(plan.line())
    return plan


def _resume(setup: Any, trainer: Trainer, rank: int, log) -> tuple[int | None, dict]:
    """Restore the last committed checkpoint of this run, if any: (step resumed from, what
    changed in the environment since it was written). A worker group Ray Train restarted
    takes the newer of the checkpoint Ray holds and the run folder's: Ray hears of a commit
    when its controller next polls, so its record can be one behind."""
    ckpt = checkpoint.resume_point(
        setup.paths.run / "checkpoints", setup.fingerprint, setup.total_steps, rank, log
    )
    held = ray_engine.restored(setup.fingerprint, log) if ray_engine.in_worker() else None
    if held is not None and (ckpt is None or _step(held) > _step(ckpt)):
        ckpt = held
    if ckpt is None:
        return None, {}
    trainer.restore(ckpt)
    changes = checkpoint.environment_changes(ckpt.fingerprint, setup.fingerprint)
    if changes:
        log(f"warning: resuming under a changed environment (recorded in the run log): {changes}")
    log(f"resuming from {ckpt.path} (step {trainer.progress.global_step} of {setup.total_steps})")
    return trainer.progress.global_step, changes


def _step(ckpt: checkpoint.Checkpoint) -> int:
    return ckpt.meta["trainer"]["global_step"]


def train(root: Path, paths: Paths, setup_class: type, skip_plan: bool = False, log=None) -> dict[str, Any]:
    """One run of a model spec in this process (a rank of it, with `processes` > 1)."""
    rank, world = rank_and_world()
    log = (log or say) if rank == 0 else (lambda msg: None)  # rank 0 speaks for the run
    started = time.perf_counter()
    setup = setup_class(root, paths)
    setup.check_world(world)
    if world > 1:
        distributed.init(setup.device, agent_is_parent=not ray_engine.in_worker())
    plan = None if skip_plan else _plan(setup, world, log)

    since = time.perf_counter() - setup.encode_s  # the plan's projection counts encoding too
    trainer = setup.trainer()
    resumed_from, env_changes = _resume(setup, trainer, rank, log)
    if world > 1:
        distributed.barrier()  # every rank has read the checkpoint before rank 0 writes the next
    every, keep = setup.spec.checkpoint.every_steps, setup.spec.checkpoint.keep
    on_commit = ray_engine.report if ray_engine.in_worker() else None
    saver = checkpoint.Checkpointer(
        paths.run / "checkpoints", every, keep, setup.fingerprint, rank, on_commit
    )
    committed = getattr(setup, "plan", None)  # a language model's committed plan
    watchdog = BudgetWatchdog(
        setup.spec, paths.spec, paths.name, plan, setup.device, since, saver, log, committed
    )

    fingerprint = Fingerprint(**setup.fingerprint, total_steps=setup.total_steps)
    key = train_key(fingerprint)
    updates = UpdateLog(update_log(paths.run, key), rank)
    t_loop = time.perf_counter()
    own = setup.callbacks()  # before the checkpoint: the checkpoint of that update holds theirs
    try:
        seen = trainer.fit(callbacks=(*own, saver, watchdog, updates))
    finally:
        updates.close()
    # Time the kind's callbacks spent scoring is not training: left out of the run's speed.
    loop_s = time.perf_counter() - t_loop - sum(getattr(c, "seconds", 0.0) for c in own)
    saver.save(trainer)  # the final state, always: resume_check compares these
    if world > 1:
        distributed.close()
        if rank > 0:  # every rank holds the same model; rank 0 exports it
            return {"rank": rank}
    record = setup.finish(trainer, fingerprint)
    _write_curve(paths.plots, trainer)
    timing = {"seen": seen, "loop_s": loop_s, "wall_s": time.perf_counter() - started}
    told = _telemetry(setup, trainer, timing, saver.seconds, key, plan, resumed_from, env_changes)
    return {**record, **told}


def _telemetry(setup, trainer: Trainer, timing, ckpt_s, key, plan, resumed, changes) -> dict[str, Any]:
    seen, loop_s = timing["seen"], timing["loop_s"]
    telemetry = {
        "wall_s": round(timing["wall_s"], 2),
        "examples_seen_this_run": seen,
        "examples_per_s": round(seen / loop_s, 1) if loop_s > 0 else None,
        "checkpoint_s": round(ckpt_s, 2),
        "checkpoint_share": round(ckpt_s / loop_s, 4) if loop_s > 0 else None,
        "peak_rss_gb": round(peak_rss_gb(), 3),
        "device_peak_gb": device_peak_gb(setup.device),
        "device": str(setup.device),
        "processes": trainer.world,
        "resumed_from_step": resumed,
        "restarts": attempt(),  # by the executor, within this launch
        "environment_changes": changes,
        "projected": plan.as_dict() if plan else None,
        "train_key": key,
    }
    return telemetry | setup.telemetry(seen, loop_s)


def _write_curve(plots: Path, trainer: Trainer) -> None:
    plots.mkdir(parents=True, exist_ok=True)
    with open(plots / "train.tsv", "w") as f:
        f.write("step\tloss\tlr\n")
        p = trainer.progress
        for i, (loss, lr) in enumerate(zip(p.losses, p.lrs, strict=True), start=1):
            f.write(f"{i}\t{loss:.6f}\t{lr:.8g}\n")


def summary(name: str, m: dict[str, Any]) -> str:
    if "rank" in m:
        return ""  # rank 0 speaks for the run
    procs = f" in {m['processes']} processes" if m.get("processes", 1) > 1 else ""
    if "tokens_seen" in m:
        val = m["validation_nats_per_token"]
        return (
            f"train: {name}: {m['steps']} steps on {m['device']}{procs} in {m['wall_s']:.1f} s, "
            f"{m['tokens_seen']:,} tokens ({m['tokens_per_s']} tokens/s), final loss {m['final_loss']:.4f}, "
            f"validation {'-' if val is None else f'{val:.4f}'} nats/token, "
            f"peak memory {m['peak_rss_gb']:.2f} GB"
        )
    return (
        f"train: {name}: {m['steps']} steps on {m['device']}{procs} in {m['wall_s']:.1f} s, "
        f"{m['examples_per_s']} examples/s, final loss {m['final_loss']:.4f}, validation accuracy "
        f"{m['validation_accuracy']:.4f}, peak memory {m['peak_rss_gb']:.2f} GB"
    )


def ray_rank(root: Path, paths: Paths, setup_class: type, skip_plan: bool) -> dict[str, Any]:
    """One Ray Train worker's share of the run (ray_engine calls it in every worker, which Ray
    starts in a folder of its own)."""
    os.chdir(root)
    return train(root, paths, setup_class, skip_plan)
