"""One training loop for every model family, with exact resume.

The state that decides the future of a run is all in the checkpoint: model, optimizer,
scheduler, gradient scaler, RNG states (Python, NumPy, torch CPU, CUDA/MPS) per rank,
global step, epoch and the sampler position (micro-batches consumed in the epoch, per rank),
plus the per-step loss and learning-rate record. The sampler has no hidden state: the order
of epoch e is a permutation drawn from (seed, e), so (epoch, position) restores it exactly.

Checkpoints are written only at update boundaries. A run killed between two micro-batches
of one update resumes from the last committed checkpoint and replays that update.
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from tqdm import tqdm

from reprogate.runtime.device import rank_and_world, seed_everything
from reprogate.train import checkpoint, distributed
from reprogate.train.objectives import Objective
from reprogate.utils.errors import UserError
from reprogate.utils.pause import pause_if


class EpochSampler:
    """Micro-batches of one rank for one epoch: a (seed, epoch) permutation, sharded by rank."""

    def __init__(self, n: int, micro_batch: int, seed: int, rank: int = 0, world: int = 1):
        self.n, self.micro_batch, self.seed, self.rank, self.world = n, micro_batch, seed, rank, world
        self._epoch: tuple[int, list[np.ndarray]] | None = None

    def batches(self, epoch: int) -> list[np.ndarray]:
        # Kept for the epoch: a language model's epoch is a permutation of a million window
        # starts, and `fit` asks again at every call (plan measures one update per call).
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = (epoch, self._draw(epoch))
        return self._epoch[1]

    def _draw(self, epoch: int) -> list[np.ndarray]:
        perm = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        # Equal shards, so every rank takes part in every update (the last n mod world are left
        # out of this epoch's order, as DistributedSampler's drop_last does).
        perm = perm[: self.n - self.n % self.world][self.rank :: self.world]
        return [perm[i : i + self.micro_batch] for i in range(0, len(perm), self.micro_batch)]

    def micro_batches_per_epoch(self) -> int:
        return math.ceil(self.n // self.world / self.micro_batch)


def lr_factor(kind: str, warmup: int, total: int, floor: float = 0.0) -> Callable[[int], float]:
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if kind == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total - warmup)
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return f


def adamw_implementation(name: str) -> dict[str, bool]:
    """AdamW's keyword for the spec's implementation. The fused kernel computes its square root
    and division correctly rounded on every CPU; the default (foreach) one calls MKL's vsSqrt on
    CPU, which rounds as the vendor's code path does (docs/reproducibility.md)."""
    return {"fused": True} if name == "fused" else {}


@dataclass
class Progress:
    global_step: int = 0
    epoch: int = 0
    position: int = 0  # micro-batches of the current epoch already consumed (this rank)
    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    # Points a callback scored during training (a language model's validation loss by step).
    evals: list[dict[str, float]] = field(default_factory=list)


class Callback(Protocol):
    """Called after every optimizer update, on every rank (checkpoints, the budget watchdog)."""

    def on_update(self, trainer: Trainer) -> None: ...


class Trainer:
    def __init__(self, spec, model, objective: Objective, device, total_steps: int):
        self.spec, self.model, self.objective, self.device = spec, model, objective, device
        self.rank, self.world = rank_and_world()
        self.total_steps = total_steps
        self.model.to(device)
        o = spec.optimizer
        self.optimizer = torch.optim.AdamW(
            param_groups(self.model, o.lr, o.head_lr), lr=o.lr, betas=tuple(o.betas), eps=o.eps,
            weight_decay=o.weight_decay, **adamw_implementation(o.implementation),
        )  # fmt: skip
        warmup = round(spec.schedule.warmup_fraction * total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_factor(spec.schedule.kind, warmup, total_steps, spec.schedule.min_lr_fraction)
        )
        self.scaler = torch.amp.GradScaler(device.type, enabled=spec.precision == "fp16")
        self.sampler = EpochSampler(objective.n, spec.micro_batch, spec.seed, self.rank, self.world)
        self.progress = Progress()
        if self.world > 1:
            # Same initial weights on every rank (seeded before the model was built), but each
            # rank its own dropout draws from here on.
            seed_everything(spec.seed * 1000 + self.rank, spec.threads, device)

    # ------------------------------------------------------------------ state <-> files

    def state(self) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any]]:
        tensors: dict[str, dict[str, torch.Tensor]] = {"model": dict(self.model.state_dict())}
        opt = self.optimizer.state_dict()
        tensors["optimizer"] = {
            f"{pid}.{k}": v for pid, st in opt["state"].items() for k, v in st.items() if torch.is_tensor(v)
        }
        r = f"rank{self.rank}"
        np_state = np.random.get_state()
        rng = {
            f"{r}.torch_cpu": torch.get_rng_state(),
            f"{r}.numpy_keys": torch.from_numpy(np_state[1].copy()),
        }
        if self.device.type == "cuda":
            for i, s in enumerate(torch.cuda.get_rng_state_all()):
                rng[f"{r}.cuda{i}"] = s
        if self.device.type == "mps":
            rng[f"{r}.mps"] = torch.mps.get_rng_state()
        p = self.progress
        rng_meta = {
            r: {
                "python": _jsonable(random.getstate()),
                "numpy": [np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])],
            }
        }
        position = {r: p.position}
        if self.world > 1:  # rank 0 writes the checkpoint: it holds every rank's RNG and position
            # As numpy arrays: torch tensors do not survive all_gather_object's pickling.
            mine = ({k: v.cpu().numpy() for k, v in rng.items()}, rng_meta, position)
            for other in distributed.gather(mine, self.world):
                rng.update({k: torch.from_numpy(v) for k, v in other[0].items()})
                rng_meta.update(other[1])
                position.update(other[2])
        tensors["rng"] = rng
        meta = {
            "optimizer": {"param_groups": opt["param_groups"]},
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng_meta,
            "trainer": {
                "global_step": p.global_step,
                "epoch": p.epoch,
                "position": position,
                "losses": p.losses,
                "lrs": p.lrs,
                "evals": p.evals,
                "total_steps": self.total_steps,
                "world_size": self.world,
            },
        }
        return tensors, meta

    def restore(self, ckpt: checkpoint.Checkpoint) -> None:
        t, m = ckpt.tensors, ckpt.meta
        r = f"rank{self.rank}"
        if m["trainer"].get("world_size", 1) != self.world:
            raise UserError(
                f"{ckpt.path} was written by a run of {m['trainer'].get('world_size', 1)} processes, and "
                f"this one has {self.world}: the epochs are sharded differently, so it cannot resume "
                "exactly. Run with the number of processes the checkpoint was written with."
            )
        self.model.load_state_dict(t["model"])
        state: dict[int, dict[str, torch.Tensor]] = {}
        for key, v in t["optimizer"].items():
            pid, name = key.split(".", 1)
            state.setdefault(int(pid), {})[name] = v
        self.optimizer.load_state_dict({"state": state, "param_groups": m["optimizer"]["param_groups"]})
        self.scheduler.load_state_dict(m["scheduler"])
        self.scaler.load_state_dict(m["scaler"])
        py = m["rng"][r]["python"]
        random.setstate((py[0], tuple(py[1]), py[2]))
        name, pos, has_gauss, cached = m["rng"][r]["numpy"]
        np.random.set_state(
            (name, t["rng"][f"{r}.numpy_keys"].numpy().astype(np.uint32), pos, has_gauss, cached)
        )
        torch.set_rng_state(t["rng"][f"{r}.torch_cpu"])
        if self.device.type == "cuda":
            torch.cuda.set_rng_state_all(
                [
                    t["rng"][f"{r}.cuda{i}"]
                    for i in range(torch.cuda.device_count())
                    if f"{r}.cuda{i}" in t["rng"]
                ]
            )
        if self.device.type == "mps" and f"{r}.mps" in t["rng"]:
            torch.mps.set_rng_state(t["rng"][f"{r}.mps"])
        tr = m["trainer"]
        self.progress = Progress(
            tr["global_step"], tr["epoch"], tr["position"][r], tr["losses"], tr["lrs"], tr.get("evals", [])
        )

    # ------------------------------------------------------------------------ the loop

    def _autocast(self):
        if self.spec.precision == "fp32":
            return torch.autocast(self.device.type, enabled=False)
        dtype = torch.bfloat16 if self.spec.precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def update(self, group: list[np.ndarray]) -> float:
        """One optimizer update over the micro-batches of `group` (gradient accumulation)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        n_items = sum(self.objective.items(b) for b in group)
        total = 0.0
        for j, idx in enumerate(group):
            # Sum over items / items in the whole update: equal to one big batch of n_items.
            loss = self.objective.loss_sum(self.model, idx, self._autocast) / n_items
            self.scaler.scale(loss).backward()
            total += loss.item()
            if j + 1 < len(group):
                pause_if(f"micro:{self.progress.global_step + 1}.{j + 1}")
        if self.world > 1:
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            distributed.average_gradients(params, self.world)
            total = distributed.mean(total, self.device, self.world)
        if self.spec.optimizer.grad_clip is not None:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.optimizer.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        return total

    def fit(
        self,
        callbacks: Sequence[Callback] = (),
        max_updates: int | None = None,
        show_progress: bool = True,
    ) -> int:
        """Train until total_steps (or `max_updates` more updates); returns examples seen."""
        p, accum = self.progress, self.spec.grad_accum
        seen, done = 0, 0
        bar = tqdm(
            total=self.total_steps,
            initial=p.global_step,
            desc="train",
            unit="step",
            disable=not show_progress or self.rank != 0,
            file=sys.stderr,
            dynamic_ncols=True,
            # In a log (not a terminal) a line every few seconds is enough.
            mininterval=0.1 if sys.stderr.isatty() else 5.0,
        )
        start = time.perf_counter()
        try:
            while p.global_step < self.total_steps and (max_updates is None or done < max_updates):
                batches = self.sampler.batches(p.epoch)
                while p.position < len(batches) and p.global_step < self.total_steps:
                    if max_updates is not None and done >= max_updates:
                        break
                    group = batches[p.position : p.position + accum]
                    lr = self.optimizer.param_groups[-1]["lr"]  # the spec's lr (head_lr's group is first)
                    loss = self.update(group)
                    p.global_step += 1
                    p.position += len(group)
                    if p.position >= len(batches):
                        p.epoch, p.position = p.epoch + 1, 0
                    p.losses.append(loss)
                    p.lrs.append(lr)
                    n = sum(len(b) for b in group) * self.world
                    seen += n
                    done += 1
                    bar.update(1)
                    bar.set_postfix(
                        loss=f"{loss:.4f}", ex_s=f"{seen / (time.perf_counter() - start):.0f}", refresh=False
                    )
                    for c in callbacks:
                        c.on_update(self)
                    pause_if(f"step:{p.global_step}")
                    if p.position == 0:
                        break  # next epoch: draw its order
        finally:
            bar.close()
        return seen


def param_groups(model: torch.nn.Module, lr: float, head_lr: float | None) -> list[dict]:
    """One group of every trainable parameter, or two: the head's (`head.*`) at head_lr first."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if head_lr is None:
        return [{"params": [p for _, p in named]}]
    head = [p for n, p in named if n.startswith("head.")]
    rest = [p for n, p in named if not n.startswith("head.")]
    return [{"params": head, "lr": head_lr}, {"params": rest, "lr": lr}]


def _jsonable(obj):
    if isinstance(obj, tuple | list):
        return [_jsonable(x) for x in obj]
    return obj


def total_steps(spec, n_examples: int) -> int:
    if spec.steps is not None:
        return spec.steps
    # Each of the spec's processes takes an equal shard of every epoch: counted by the sampler
    # that draws them, so the two cannot disagree.
    sampler = EpochSampler(n_examples, spec.micro_batch, spec.seed, world=spec.processes)
    return spec.epochs * math.ceil(sampler.micro_batches_per_epoch() / spec.grad_accum)
