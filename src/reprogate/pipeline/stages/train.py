"""Stage `train@m`: build a run, fit it with auto-resume, export the model, record the run.

runs/<m>/checkpoints/  full-state checkpoints: the run's working state, not a DVC output, so
                       DVC never deletes them (a rerun resumes) nor caches or pushes them
models/<m>/            weights (safetensors), config, labels, fingerprint: what predict loads
metrics/<m>/train.json steps, epochs, final loss, validation accuracy (the same on every rerun)
plots/<m>/train.tsv    step, loss, learning rate (one value per step: what the model kept)
runs/<m>/updates/<k>.jsonl  every update as it happened, a resumed run's repeats included
                       (k: the run's train key; read by the registry's metrics_raw)
logs/train@<m>.jsonl   a line per run: wall time, examples/s, peak memory, device, projected vs
                       actual, resumed from (git-ignored telemetry, see runlog.py; written by
                       stages.run from this stage's Result)
A spec with `processes: N` starts N ranks of this same command under the elastic agent, or,
with `executor: ray`, runs `train` on N Ray Train workers; rank 0 speaks for the run.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from reprogate.lm.training import LM_FILES, LmSetup, ValidationPoints, export_lm
from reprogate.pipeline.context import Context, Result
from reprogate.records import Fingerprint, TrainRecord, train_key, write
from reprogate.records.lm import LmTrainRecord
from reprogate.records.runlog import UpdateLog, peak_rss_gb
from reprogate.runtime.device import device_peak_gb, rank_and_world
from reprogate.specs import ModelSpec, Pipeline, load_spec
from reprogate.train import checkpoint, distributed, ray_engine
from reprogate.train.folder import TRAIN_FILES, export_trained
from reprogate.train.plan import BudgetWatchdog, Plan, check_budget, measure
from reprogate.train.run import Paths, Setup, processes_to_launch, validation_accuracy
from reprogate.train.trainer import Trainer
from reprogate.utils.paths import update_log
from reprogate.utils.pause import attempt

PER_MODEL = "trained"
NUMERIC = True  # its outputs are floats: it reruns when params.yaml's numerics change
RECORD_FIELDS = {*TrainRecord.model_fields, *LmTrainRecord.model_fields}


def dvc(p: Pipeline) -> dict[str, Any]:
    if p.kind == "lm":
        return {
            "deps": ["data/tokens/${key}"],
            # The committed plan fixes a budget.train_minutes run's steps (the spec itself otherwise).
            "params": [{"specs/models/${key}.yaml": None}, {"${item.plan}": None}],
            "outs": [f"models/${{key}}/{f}" for f in LM_FILES],
            "metrics": [{"metrics/${key}/train.json": {"cache": False}}],
            "plots": [
                {"plots/${key}/train.tsv": {"x": "step", "y": "loss", "cache": False}},
                *(
                    {f"plots/${{key}}/validation_by_{x}.tsv": {"x": x, "y": "nats_per_token", "cache": False}}
                    for x in ("tokens", "seconds")
                ),
            ],
        }
    return {
        "deps": ["data/prepared", "data/features/${key}"],
        "params": [{"specs/models/${key}.yaml": None}],
        "outs": [f"models/${{key}}/{f}" for f in TRAIN_FILES],
        "metrics": [{"metrics/${key}/train.json": {"cache": False}}],
        "plots": [{"plots/${key}/train.tsv": {"x": "step", "y": "loss", "cache": False}}],
    }


def _plan(setup: Setup, world: int, log) -> Plan:
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


def _resume(setup: Setup, trainer: Trainer, rank: int, log) -> tuple[int | None, dict]:
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


def train(root: Path, paths: Paths, skip_plan: bool = False, log=None) -> dict[str, Any]:
    """One run of a model spec in this process (a rank of it, with `processes` > 1)."""
    rank, world = rank_and_world()
    log = (log or Context(root).log) if rank == 0 else (lambda msg: None)  # rank 0 speaks for the run
    started = time.perf_counter()
    lm = load_spec(paths.spec, ModelSpec).family == "causal_lm"
    setup = LmSetup(root, paths) if lm else Setup(root, paths)
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
    # Validation points first: the checkpoint of that update holds them.
    points = ValidationPoints(setup) if lm else None
    callbacks = ((points,) if points else ()) + (saver, watchdog, updates)
    try:
        seen = trainer.fit(callbacks=callbacks)
    finally:
        updates.close()
    loop_s = time.perf_counter() - t_loop - (points.seconds if points else 0.0)
    saver.save(trainer)  # the final state, always: resume_check compares these
    if world > 1:
        distributed.close()
        if rank > 0:  # every rank holds the same model; rank 0 exports it
            return {"rank": rank}
    if lm:
        export_lm(paths.model, setup, trainer.model, fingerprint)
        record = _lm_record(paths, setup, trainer)
    else:
        val_acc = validation_accuracy(setup, trainer)
        labels = setup.data.labels
        export_trained(paths.model, setup.spec, trainer.model, setup.featurizer, labels, fingerprint)
        record = _record(paths, setup, trainer, val_acc)
    _write_curve(paths.plots, trainer)
    timing = {"seen": seen, "loop_s": loop_s, "wall_s": time.perf_counter() - started}
    told = _telemetry(setup, trainer, timing, saver.seconds, key, plan, resumed_from, env_changes)
    return {**record, **told}


def _record(paths: Paths, setup: Setup, trainer: Trainer, val_acc: float) -> dict[str, Any]:
    p = trainer.progress
    record = TrainRecord(
        steps=p.global_step,
        epochs=p.epoch,
        examples=len(setup.feats),
        final_loss=p.losses[-1] if p.losses else None,
        validation_accuracy=round(val_acc, 4),
        truncated_texts=setup.featurizer.truncated,
    )
    write(paths.metrics / "train.json", record)
    return record.model_dump(mode="json", exclude_unset=True)


def _lm_record(paths: Paths, setup: LmSetup, trainer: Trainer) -> dict[str, Any]:
    p = trainer.progress
    record = LmTrainRecord(
        steps=p.global_step,
        epochs=p.epoch,
        windows=len(setup.feats),
        tokens_seen=p.global_step * setup.tokens_per_update(),
        final_loss=p.losses[-1] if p.losses else None,
        planned_minutes=round(p.global_step * setup.plan.measured.update_s / 60, 3) if setup.plan else None,
        validation_nats_per_token=p.evals[-1]["nats_per_token"] if p.evals else None,
    )
    write(paths.metrics / "train.json", record)
    curve = ["step\ttokens\tseconds\tnats_per_token"]
    for e in p.evals:
        # Seconds as planned (step x the plan's measured seconds per update): the same on every
        # rerun; the seconds this run took are in its run log.
        secs = f"{e['step'] * setup.plan.measured.update_s:.1f}" if setup.plan else ""
        curve.append(f"{e['step']}\t{e['tokens']}\t{secs}\t{e['nats_per_token']:.6f}")
    paths.plots.mkdir(parents=True, exist_ok=True)
    for name in ("validation_by_tokens.tsv", "validation_by_seconds.tsv"):
        (paths.plots / name).write_text("\n".join(curve) + "\n")
    return record.model_dump(mode="json")


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
    if isinstance(setup, LmSetup) and loop_s > 0:
        telemetry["tokens_per_s"] = round(seen * setup.spec.causal_lm.context / loop_s, 1)
    return telemetry


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


def _rank(root: Path, paths: Paths, skip_plan: bool) -> dict[str, Any]:
    """One Ray Train worker's share of the run (ray_engine calls it in every worker, which Ray
    starts in a folder of its own)."""
    os.chdir(root)
    return train(root, paths, skip_plan)


def run(ctx: Context) -> Result:
    paths = Paths.for_model(ctx.root, ctx.model, ctx.spec, ctx.run_dir, ctx.work_dir)
    spec = load_spec(paths.spec, ModelSpec)
    if spec.executor == "ray":
        m = ray_engine.launch(spec, paths.spec, paths.run, _rank, (ctx.root.resolve(), paths, ctx.skip_plan))
    elif processes := processes_to_launch(paths):  # this process starts the ranks, each of which
        argv = ["stage", "train", ctx.model, "--spec", str(paths.spec)]  # runs this same command
        argv += [f"--{k}-dir={v}" for k, v in (("run", ctx.run_dir), ("work", ctx.work_dir)) if v]
        argv += ["--skip-plan"] * ctx.skip_plan
        return Result(distributed.launch(ctx.root, argv, processes, paths.spec, spec.max_restarts))
    else:
        m = train(ctx.root, paths, ctx.skip_plan, ctx.log)
    # Everything but the tracked record is telemetry (rank > 0 returns {"rank": r}, logs nothing).
    return Result(
        summary(ctx.model, m),
        telemetry={k: v for k, v in m.items() if k not in RECORD_FIELDS},
    )
