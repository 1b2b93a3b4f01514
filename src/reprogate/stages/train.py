"""Stage `train@m`: fit one model spec with auto-resume, export the model, record metrics.

runs/<m>/checkpoints/  full-state checkpoints (DVC persist: they survive `dvc repro`)
models/<m>/            weights (safetensors), config, labels, fingerprint: what predict loads
metrics/<m>/train.json steps, examples/s, wall time, peak memory, device, projected vs actual
plots/<m>/train.tsv    step, loss, learning rate
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from reprogate.errors import UserError
from reprogate.hashing import sha256_file
from reprogate.specs import DataSpec, ModelSpec, load_spec, training_hash

PREPARED = Path("data/prepared")


@dataclass
class Paths:
    name: str
    spec: Path
    run: Path
    model: Path
    metrics: Path
    plots: Path

    @classmethod
    def for_model(
        cls,
        root: Path,
        name: str,
        spec: Path | None = None,
        run: Path | None = None,
        work: Path | None = None,
    ) -> Paths:
        if work is not None:  # everything of this run in one folder (resume_check, tests)
            return cls(
                name,
                spec or root / "specs" / "models" / f"{name}.yaml",
                work,
                work / "model",
                work / "metrics",
                work / "plots",
            )
        return cls(
            name=name,
            spec=spec or root / "specs" / "models" / f"{name}.yaml",
            run=run or root / "runs" / name,
            model=root / "models" / name,
            metrics=root / "metrics" / name,
            plots=root / "plots" / name,
        )


def code_hash() -> str:
    pkg = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(pkg.rglob("*.py")):
        h.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def load_train_data(root: Path, spec: ModelSpec, spec_path: Path):
    from reprogate.specs import OOS_LABEL
    from reprogate.stages.features import require_prepared
    from reprogate.trainer import Example, TrainData, read_jsonl

    prepared = require_prepared(root, spec_path)
    labels = json.loads((prepared / "labels.json").read_text())
    declared = load_spec(root / spec.data, DataSpec).labels
    if labels != declared:
        raise UserError(
            f"{prepared}/labels.json differs from the labels of {spec.data}: the prepared data is "
            "stale. Run `dvc repro prepare`."
        )
    files = [prepared / "labels.json", prepared / "train.jsonl"]
    index = {lbl: i for i, lbl in enumerate(labels)}
    examples = [Example(r["text"], index[r["label"]]) for r in read_jsonl(prepared / "train.jsonl")]
    out = list(labels)
    if spec.head.out_of_scope_class:
        neg = prepared / "negatives.jsonl"
        if not neg.is_file():
            raise UserError(
                f"{spec_path}: head.out_of_scope_class is true, but {prepared} has no negatives.jsonl: "
                f"it was prepared before {spec.data} declared negatives. Run `dvc repro prepare`."
            )
        files.append(neg)
        examples += [Example(r["text"], len(labels)) for r in read_jsonl(neg)]
        out.append(OOS_LABEL)
    data_hash = hashlib.sha256("".join(sha256_file(f) for f in files).encode()).hexdigest()
    return TrainData(examples, out, data_hash)


def fingerprint(spec: ModelSpec, data, device, featurizer) -> dict[str, Any]:
    from reprogate.runtime import environment

    encoder = {"encoder_sha256": featurizer.encoder_sha256} if spec.family == "encoder" else {}
    return {
        **encoder,
        "spec_hash": training_hash(spec),
        "data_hash": data.data_hash,
        "labels_hash": hashlib.sha256(json.dumps(data.labels).encode()).hexdigest(),
        "code_hash": code_hash(),
        "environment": environment(device),
    }


def rank_device(device, spec: ModelSpec, spec_path: Path):
    """This rank's device: its own GPU on CUDA (LOCAL_RANK), the CPU otherwise."""
    import os

    import torch

    if device.type == "mps":
        raise UserError(
            f"{spec_path}: field 'processes' is {spec.processes}, but device 'auto' chose mps, which "
            "has no multi-process backend in PyTorch; use processes: 1, or device: cpu."
        )
    if device.type != "cuda":
        return device
    if torch.cuda.device_count() < spec.processes:
        raise UserError(
            f"{spec_path}: field 'processes' is {spec.processes}, but this machine has "
            f"{torch.cuda.device_count()} CUDA device(s) and each process needs its own; use processes: "
            f"{torch.cuda.device_count()} or fewer."
        )
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    return torch.device("cuda", local)


def checked_total_steps(spec: ModelSpec, spec_path: Path, n_examples: int) -> int:
    """The run's optimizer updates, once the number of examples is known; a checkpoint interval
    longer than the run is refused (no checkpoint would ever be written)."""
    from reprogate.trainer import total_steps

    steps = total_steps(spec, n_examples)
    if spec.checkpoint.every_steps > steps:
        raise UserError(
            f"{spec_path}: field 'checkpoint.every_steps' is {spec.checkpoint.every_steps}, but "
            f"this run has only {steps} steps ({spec.epochs} epochs of {n_examples} examples); "
            f"use at most {steps}."
        )
    return steps


def prepared_steps(root: Path, spec: ModelSpec, spec_path: Path) -> int | None:
    """What `checked_total_steps` will say when training starts, said at `validate` time from
    the prepared data's row counts, when data/prepared holds the spec's data (None otherwise)."""
    from reprogate.trainer import read_jsonl

    if spec.family == "ensemble" or spec.steps is not None:
        return None
    prepared = root / PREPARED
    data_spec = root / spec.data
    if not (prepared / "labels.json").is_file() or not data_spec.is_file():
        return None
    if json.loads((prepared / "labels.json").read_text()) != load_spec(data_spec, DataSpec).labels:
        return None  # prepared from another data spec
    names = ["train"] + (["negatives"] if spec.head.out_of_scope_class else [])
    parts = [prepared / f"{n}.jsonl" for n in names]
    if not all(p.is_file() for p in parts):
        return None  # prepared before the data spec had negatives: train says to rerun prepare
    return checked_total_steps(spec, spec_path, sum(len(read_jsonl(p)) for p in parts))


class Setup:
    """Everything needed to build a fresh, seeded trainer (possibly more than once)."""

    def __init__(self, root: Path, paths: Paths):
        from reprogate.runtime import configure_mps_env, select_device

        self.root, self.paths = root, paths
        self.spec = load_spec(paths.spec, ModelSpec)
        configure_mps_env(self.spec)
        self.device = select_device(self.spec, paths.spec)
        if self.spec.processes > 1:
            self.device = rank_device(self.device, self.spec, paths.spec)
        self.data = load_train_data(root, self.spec, paths.spec)
        t0 = time.perf_counter()
        _, self.featurizer = self._build()
        if hasattr(self.featurizer, "device"):  # a frozen encoder loads onto it when first needed
            self.featurizer.device = self.device
        self.feats = self.split("train")
        if self.spec.head.out_of_scope_class:
            from reprogate.stages.features import concat

            self.feats = concat(self.feats, self.split("negatives"))
        self.encode_s = time.perf_counter() - t0
        self.total_steps = checked_total_steps(self.spec, paths.spec, len(self.feats))
        self.fingerprint = fingerprint(self.spec, self.data, self.device, self.featurizer)

    def split(self, name: str):
        """Features of a prepared split: from features@m when it matches, else encoded now."""
        from reprogate.stages.features import split_features

        return split_features(self.root, self.paths.name, self.featurizer, name)

    def _build(self):
        from reprogate import models
        from reprogate.runtime import seed_everything

        seed_everything(self.spec.seed, self.spec.threads, self.device)
        return models.build(self.spec, len(self.data.labels), self.root)

    def trainer(self):
        from reprogate.trainer import Trainer

        model, _ = self._build()
        return Trainer(
            self.spec, model, self.featurizer, self.data, self.feats, self.device, self.total_steps
        )


def processes_to_launch(paths: Paths) -> int:
    """The spec's number of processes when this process must start them (not itself a rank)."""
    from reprogate.runtime import rank_and_world

    n = load_spec(paths.spec, ModelSpec).processes
    return n if n > 1 and rank_and_world()[1] == 1 else 0


def run(root: Path, paths: Paths, skip_plan: bool = False, log=None) -> dict[str, Any]:
    from reprogate import checkpoint, distributed
    from reprogate.plan import check_budget, measure
    from reprogate.runtime import device_peak_gb, peak_rss_gb, rank_and_world
    from reprogate.trainer import pause_if

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    rank, world = rank_and_world()
    if rank > 0:
        log = lambda msg: None  # noqa: E731 - rank 0 speaks for the run
    started = time.perf_counter()
    setup = Setup(root, paths)
    spec = setup.spec
    if world != spec.processes:
        raise UserError(
            f"{paths.spec}: field 'processes' is {spec.processes}, but this run was launched as "
            f"{world} processes (WORLD_SIZE={world}); launch it with `reprogate stage train "
            f"{paths.name}`, which starts the spec's number of processes, or set processes: {world}."
        )
    if world > 1:
        distributed.init(setup.device)
    plan = None
    if not skip_plan:
        plan = measure(setup)
        if world > 1:  # one decision for all ranks, or they would part ways: the slowest
            plans = distributed.gather(plan, world)  # rank's time, all ranks' memory together
            plan = replace(
                max(plans, key=lambda p: p.projected_minutes),
                projected_memory_gb=sum(p.projected_memory_gb for p in plans),
            )
        check_budget(plan, spec, paths.spec)
        log(plan.line())

    t_run = time.perf_counter() - setup.encode_s  # the plan's projection counts encoding too
    trainer = setup.trainer()
    ckpt_dir = paths.run / "checkpoints"
    resumed_from, env_changes = None, {}
    ckpt = checkpoint.load_latest(ckpt_dir, setup.fingerprint, log)
    if ckpt is not None and ckpt.meta["trainer"]["global_step"] >= setup.total_steps:
        changed = checkpoint.environment_changes(ckpt.fingerprint, setup.fingerprint)
        if changed:
            # DVC reruns a finished run only when something changed; code or packages did.
            log(
                f"the finished run in {ckpt.path} used other code or packages ({sorted(changed)}); "
                "training again from scratch"
            )
            ckpt = None
    if ckpt is not None:
        trainer.restore(ckpt)
        resumed_from = trainer.progress.global_step
        env_changes = checkpoint.environment_changes(ckpt.fingerprint, setup.fingerprint)
        if env_changes:
            log(f"warning: resuming under a changed environment (recorded in train.json): {env_changes}")
        log(f"resuming from {ckpt.path} (step {resumed_from} of {setup.total_steps})")
    if ckpt is None and ckpt_dir.exists() and any(ckpt_dir.iterdir()) and rank == 0:
        log(f"no usable checkpoint of this run in {ckpt_dir}; removing what is there and starting fresh")
        shutil.rmtree(ckpt_dir)
    if world > 1:
        distributed.barrier()  # every rank has read the checkpoint before rank 0 writes the next

    ckpt_seconds, saved_step, warned = 0.0, None, False

    def save() -> None:
        nonlocal ckpt_seconds, saved_step
        t = time.perf_counter()
        step = saved_step = trainer.progress.global_step
        tensors, meta = trainer.state()
        if rank == 0:  # one writer; state() gathered the other ranks' RNG and positions
            checkpoint.save(
                ckpt_dir,
                step,
                tensors,
                meta,
                setup.fingerprint,
                spec.checkpoint.keep,
                hook=lambda phase: pause_if(f"ckpt:{step}:{phase}"),
            )
        ckpt_seconds += time.perf_counter() - t

    def over_budget() -> str | None:
        nonlocal warned
        minutes = (time.perf_counter() - t_run) / 60
        memory = max(peak_rss_gb(), device_peak_gb(setup.device) or 0.0)
        if world > 1:  # the run's time is its slowest rank's, its memory all ranks' together
            seen = distributed.gather((minutes, memory), world)
            minutes, memory = max(m for m, _ in seen), sum(g for _, g in seen)
        if minutes > spec.budget.max_minutes:
            return f"{minutes:.2f} min of training passed budget.max_minutes {spec.budget.max_minutes:g}"
        if memory > spec.budget.max_memory_gb:
            return f"peak memory {memory:.2f} GB passed budget.max_memory_gb {spec.budget.max_memory_gb:g}"
        if plan and not warned and minutes > 2 * plan.projected_minutes:
            warned = True
            log(
                f"warning: {minutes:.2f} min in, at update {trainer.progress.global_step} of "
                f"{setup.total_steps}: already twice the planned {plan.projected_minutes:.2f} min for the "
                "whole run (is the machine busier than when it was measured?)"
            )
        return None

    def on_update(tr) -> None:
        step = tr.progress.global_step
        if step % spec.checkpoint.every_steps == 0 and step < tr.total_steps:
            save()
        # Every rank decides alike (over_budget gathers their time and memory), so all stop together.
        why = over_budget() if step < tr.total_steps else None
        if why:
            # Stopped with its state kept, rather than left to overrun or be killed by the OOM killer.
            if saved_step != step:
                save()
            planned = (
                f"; the plan projected {plan.projected_minutes:.2f} min, {plan.projected_memory_gb:.2f} GB"
                if plan
                else ""
            )
            raise UserError(
                f"{paths.spec}: training stopped at update {step} of {tr.total_steps}: {why}{planned}. "
                f"Update {step} is checkpointed in {ckpt_dir}, and the next run resumes from it "
                f"(`dvc repro`, or `reprogate stage train {paths.name}`) with the budget counted afresh; "
                "raise the budget in the spec if the whole run needs more (the checkpoint is kept)."
            )

    t_loop = time.perf_counter()
    seen = trainer.fit(on_update=on_update)
    loop_s = time.perf_counter() - t_loop
    save()  # the final state, always: resume_check compares these
    if world > 1:
        distributed.close()
        if rank > 0:  # every rank holds the same model; rank 0 exports it
            return {"rank": rank}
    val_acc = validation_accuracy(setup, trainer)
    wall_s = time.perf_counter() - started
    export(paths.model, setup, trainer)

    p = trainer.progress
    metrics = {
        "steps": p.global_step,
        "epochs": p.epoch,
        "examples": len(setup.feats),
        "examples_seen_this_run": seen,
        "examples_per_s": round(seen / loop_s, 1) if loop_s > 0 else None,
        "wall_s": round(wall_s, 2),
        "checkpoint_s": round(ckpt_seconds, 2),
        "checkpoint_share": round(ckpt_seconds / loop_s, 4) if loop_s > 0 else None,
        "peak_rss_gb": round(peak_rss_gb(), 3),
        "device_peak_gb": device_peak_gb(setup.device),
        "device": str(setup.device),
        "processes": world,
        "final_loss": p.losses[-1] if p.losses else None,
        "validation_accuracy": round(val_acc, 4),
        "resumed_from_step": resumed_from,
        "environment_changes": env_changes,
        "truncated_texts": getattr(setup.featurizer, "truncated", 0),
        "projected": plan.as_dict() if plan else None,
    }
    paths.metrics.mkdir(parents=True, exist_ok=True)
    (paths.metrics / "train.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    paths.plots.mkdir(parents=True, exist_ok=True)
    with open(paths.plots / "train.tsv", "w") as f:
        f.write("step\tloss\tlr\n")
        for i, (loss, lr) in enumerate(zip(p.losses, p.lrs, strict=True), start=1):
            f.write(f"{i}\t{loss:.6f}\t{lr:.8g}\n")
    return metrics


def summary(name: str, m: dict[str, Any]) -> str:
    if "rank" in m:
        return ""  # rank 0 speaks for the run
    procs = f" in {m['processes']} processes" if m.get("processes", 1) > 1 else ""
    return (
        f"train: {name}: {m['steps']} steps on {m['device']}{procs} in {m['wall_s']:.1f} s, "
        f"{m['examples_per_s']} examples/s, final loss {m['final_loss']:.4f}, validation accuracy "
        f"{m['validation_accuracy']:.4f}, peak memory {m['peak_rss_gb']:.2f} GB"
    )


def validation_accuracy(setup: Setup, trainer) -> float:
    import torch

    from reprogate.stages.features import prepared_file
    from reprogate.trainer import read_jsonl

    rows = read_jsonl(prepared_file(setup.root, "validation"))
    index = {lbl: i for i, lbl in enumerate(setup.data.labels)}
    feats = setup.split("validation")
    gold = torch.tensor([index[r["label"]] for r in rows])
    pred = predict_logits(trainer.model, setup.featurizer, feats, setup.device).argmax(-1)
    return float((pred == gold).float().mean())


def predict_logits(model, featurizer, feats: list, device, batch: int = 256):
    import torch

    model.eval()
    out = []
    with torch.inference_mode():
        for i in range(0, len(feats), batch):
            b = {k: v.to(device) for k, v in featurizer.collate(feats[i : i + batch]).items()}
            out.append(model(**b).float().cpu())
    return torch.cat(out)


TRAIN_FILES = ("model.safetensors", "config.json", "labels.json", "fingerprint.json", "assets")


def export(out: Path, setup: Setup, trainer) -> None:
    """models/<m>/: weights, config, labels, fingerprint and assets/ (tokenizer and encoder
    config, or the n-gram hashing config). calibration.json beside them is calibrate@m's."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for name in TRAIN_FILES:
        old = out / name
        if old.is_dir():
            shutil.rmtree(old)
        elif old.exists():
            old.unlink()
    assets = out / "assets"
    assets.mkdir()
    model, spec = trainer.model, setup.spec
    # Frozen mode saves the head only: the encoder is the spec's folder, named by its sha256 in
    # config.json's featurizer key and checked when the model is loaded.
    state = model.state_dict()
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(out / "model.safetensors"))
    config: dict[str, Any] = {
        "family": spec.family,
        "n_out": len(setup.data.labels),
        "featurizer": setup.featurizer.key(),
        "spec": spec.model_dump(mode="json"),
    }
    if spec.family == "ngram":
        (assets / "featurizer.json").write_text(json.dumps(setup.featurizer.key(), indent=2) + "\n")
    else:
        enc = {
            "full": lambda: model.encoder,
            "lora": lambda: model.encoder.get_base_model(),
            "frozen": lambda: setup.featurizer.encoder,
        }[spec.encoder.mode]()
        enc.config.save_pretrained(assets / "encoder")
        setup.featurizer.tokenizer.save_pretrained(assets / "tokenizer")
        # transformers records how it was loaded (HF_HUB_OFFLINE, which `make` sets, becomes
        # local_files_only): not part of the tokenizer, and it would make the bytes differ
        # between `make repro` and a plain `dvc repro`.
        tok_config = assets / "tokenizer" / "tokenizer_config.json"
        if tok_config.is_file():
            saved = json.loads(tok_config.read_text())
            saved.pop("local_files_only", None)
            tok_config.write_text(json.dumps(saved, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "labels.json").write_text(json.dumps(setup.data.labels, indent=1, ensure_ascii=False) + "\n")
    fp = dict(setup.fingerprint, total_steps=setup.total_steps)
    (out / "fingerprint.json").write_text(json.dumps(fp, indent=2, sort_keys=True) + "\n")
