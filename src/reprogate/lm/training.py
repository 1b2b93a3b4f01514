"""A language model's run: its tokens, its length (steps, epochs, or the committed plan), its
fingerprint, a seeded trainer, validation points while it trains, and its model folder.

The same Trainer, checkpoints, budget watchdog and resume_check as a classifier's (training.py
builds those); only the objective (objectives.NextToken) and the data differ.

models/<m>/ of a language model: model.safetensors, config.json (records.ModelConfig, family
causal_lm, n_out = the vocabulary size), fingerprint.json, assets/tokenizer.json.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from reprogate.folder.files import clear, write_folder
from reprogate.lm import scoring as lm_eval
from reprogate.models.causal_lm import CausalLm
from reprogate.records.base import load, write
from reprogate.records.lm import LmTrainRecord, TokenRecord
from reprogate.records.train import Fingerprint, ModelConfig
from reprogate.runtime.device import configure_mps_env, environment, seed_everything, select_device
from reprogate.specs.lm import PlanSpec, speed_fields
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec, training_hash
from reprogate.train.objectives import NextToken
from reprogate.train.runs import Paths, check_world, code_hash, rank_device
from reprogate.train.trainer import Trainer, total_steps
from reprogate.utils import paths as project
from reprogate.utils.errors import UserError
from reprogate.utils.hashing import sha256_file

# A stand-in length while measuring: long enough that warm-up never ends, and an update costs
# the same whatever its learning rate.
PLANNING_STEPS = 1_000_000


def speed_key(spec: ModelSpec) -> str:
    return hashlib.sha256(repr(sorted(speed_fields(spec).items())).encode()).hexdigest()


def planned_steps(root: Path, name: str, spec: ModelSpec, spec_path: Path) -> PlanSpec:
    """The committed plan of a budget.train_minutes spec, checked against the spec."""
    path = root / project.plan_file(name)
    shown = spec_path.relative_to(root) if spec_path.is_relative_to(root) else spec_path
    fix = f"run `reprogate plan {shown} --write` and commit {project.plan_file(name)}"
    if not path.is_file():
        raise UserError(
            f"{spec_path}: budget.train_minutes is {spec.budget.train_minutes:g}, which needs a measured "
            f"number of updates in {path}, and there is none: {fix} (it measures this machine once; "
            "training never measures by itself, so every rerun trains the same steps)."
        )
    plan = load_spec(path, PlanSpec)
    stale = []
    if plan.model != name:
        stale.append(f"it is for model '{plan.model}'")
    if plan.train_minutes != spec.budget.train_minutes:
        said = f"{spec.budget.train_minutes:g}"
        stale.append(f"it was measured for {plan.train_minutes:g} minutes, the spec says {said}")
    if plan.speed_key != speed_key(spec):
        stale.append("the model shape, batch, device, precision, threads or processes changed since")
    if stale:
        raise UserError(f"{path} is stale: {'; '.join(stale)}. To measure again on purpose, {fix}.")
    return plan


def read_tokens(root: Path, name: str, spec: ModelSpec, spec_path: Path) -> tuple[TokenRecord, Path]:
    folder = root / project.tokens_dir(name)
    fix = f"run `dvc repro tokenize@{name}` (or `reprogate stage tokenize {name}`)"
    if not (folder / "manifest.json").is_file():
        raise UserError(f"{spec_path}: no tokens in {folder}: {fix} first.")
    record = load(folder / "manifest.json", TokenRecord, f"{fix}.")
    if record.tokenizer != spec.causal_lm.tokenizer.model_dump(mode="json"):
        raise UserError(
            f"{folder} was tokenized with {record.tokenizer}, but {spec_path} asks for "
            f"{spec.causal_lm.tokenizer.model_dump(mode='json')}: {fix}."
        )
    return record, folder


class LmSetup:
    """Everything needed to build a fresh, seeded language-model trainer (possibly more than once)."""

    record = LmTrainRecord  # metrics/<m>/train.json

    def __init__(self, root: Path, paths: Paths, planning: bool = False):
        """`planning`: for `reprogate plan`, which measures updates before a plan exists."""
        self.root, self.paths = root, paths
        self.spec = spec = load_spec(paths.spec, ModelSpec)
        configure_mps_env(spec)
        self.device = select_device(spec, paths.spec)
        if spec.processes > 1:
            self.device = rank_device(self.device, spec, paths.spec)
        t0 = time.perf_counter()
        self.tokens, folder = read_tokens(root, paths.name, spec, paths.spec)
        self.tokenizer_path = folder / "tokenizer.json"
        self.train_ids = load_file(str(folder / "train.safetensors"))["ids"]
        self.validation_ids = load_file(str(folder / "validation.safetensors"))["ids"]
        self.encode_s = time.perf_counter() - t0
        self.plan = None
        if planning and spec.budget.train_minutes is not None:
            steps = PLANNING_STEPS
        elif spec.budget.train_minutes is not None:
            self.plan = planned_steps(root, paths.name, spec, paths.spec)
            steps = self.plan.steps
        else:
            steps = total_steps(spec, len(self.train_ids) - spec.causal_lm.context)
        self.total_steps = steps
        self.feats = range(len(self.train_ids) - spec.causal_lm.context)  # windows, for the record
        # A planned length is what was trained: another plan is another run.
        trained = spec.model_copy(update={"steps": steps})
        self.fingerprint = {
            "spec_hash": training_hash(trained),
            "data_hash": sha256_file(folder / "manifest.json"),
            "labels_hash": self.tokens.tokenizer_sha256,
            "code_hash": code_hash(spec),
            "environment": environment(self.device),
        }

    def check_world(self, world: int) -> None:
        check_world(self.paths, self.spec, world)

    def model(self) -> CausalLm:
        seed_everything(self.spec.seed, self.spec.threads, self.device)
        return CausalLm(self.spec.causal_lm, self.tokens.vocab_size)

    def trainer(self) -> Trainer:
        model = self.model()
        objective = NextToken(self.train_ids, self.spec.causal_lm.context, self.device)
        return Trainer(self.spec, model, objective, self.device, self.total_steps)

    def tokens_per_update(self) -> int:
        s = self.spec
        return s.micro_batch * s.grad_accum * s.processes * s.causal_lm.context

    def eval_steps(self) -> set[int]:
        k = self.spec.causal_lm.eval_points
        return {max(1, round(self.total_steps * i / k)) for i in range(1, k + 1)}

    def callbacks(self) -> tuple:
        # Validation points before the checkpoint: the checkpoint of that update holds them.
        return (ValidationPoints(self),)

    def finish(self, trainer: Trainer, fingerprint: Fingerprint) -> dict[str, Any]:
        """After the fit (rank 0): the model folder, metrics/<m>/train.json and the validation
        curves, the record as a dict."""
        export_lm(self.paths.model, self, trainer.model, fingerprint)
        p, plan = trainer.progress, self.plan
        record = LmTrainRecord(
            steps=p.global_step,
            epochs=p.epoch,
            windows=len(self.feats),
            tokens_seen=p.global_step * self.tokens_per_update(),
            final_loss=p.losses[-1] if p.losses else None,
            planned_minutes=round(p.global_step * plan.measured.update_s / 60, 3) if plan else None,
            validation_nats_per_token=p.evals[-1]["nats_per_token"] if p.evals else None,
        )
        write(self.paths.metrics / "train.json", record)
        curve = ["step\ttokens\tseconds\tnats_per_token"]
        for e in p.evals:
            # Seconds as planned (step x the plan's measured seconds per update): the same on every
            # rerun; the seconds this run took are in its run log.
            secs = f"{e['step'] * plan.measured.update_s:.1f}" if plan else ""
            curve.append(f"{e['step']}\t{e['tokens']}\t{secs}\t{e['nats_per_token']:.6f}")
        self.paths.plots.mkdir(parents=True, exist_ok=True)
        for name in ("validation_by_tokens.tsv", "validation_by_seconds.tsv"):
            (self.paths.plots / name).write_text("\n".join(curve) + "\n")
        return record.model_dump(mode="json")

    def telemetry(self, seen: int, loop_s: float) -> dict[str, Any]:
        return {"tokens_per_s": round(seen * self.spec.causal_lm.context / loop_s, 1)} if loop_s > 0 else {}


class ValidationPoints:
    """Trainer callback: the whole validation split scored at evenly spaced updates (rank 0),
    kept in the trainer's progress, so it is in every checkpoint and a resumed run's curve is
    the uninterrupted one's. Scoring uses no random numbers, so training's draws are untouched."""

    def __init__(self, setup: LmSetup):
        self.setup, self.steps = setup, setup.eval_steps()
        self.seconds = 0.0  # scoring, not training: left out of the run's tokens/s

    def on_update(self, trainer: Trainer) -> None:
        step = trainer.progress.global_step
        if trainer.rank != 0 or step not in self.steps:
            return
        s, t0 = self.setup, time.perf_counter()
        scored = lm_eval.score(trainer.model, s.validation_ids, s.spec.causal_lm.context, s.device)
        self.seconds += time.perf_counter() - t0
        trainer.progress.evals.append(
            {"step": step, "tokens": step * s.tokens_per_update(), "nats_per_token": scored.nats_per_token}
        )


def export_lm(out: Path, setup: LmSetup, model: CausalLm, fingerprint: Fingerprint) -> None:
    assets = clear(out)
    shutil.copyfile(setup.tokenizer_path, assets / "tokenizer.json")
    config = ModelConfig(
        family="causal_lm",
        n_out=setup.tokens.vocab_size,
        featurizer=setup.tokens.model_dump(mode="json"),
        spec=setup.spec.model_dump(mode="json"),
    )
    write_folder(out, model, config, None, fingerprint)
