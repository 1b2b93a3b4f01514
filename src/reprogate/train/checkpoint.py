"""Full-state checkpoints: safetensors for tensors, JSON for the rest, a manifest over both.

Commit protocol (a SIGKILL at any instant leaves the previous checkpoint loadable):
  1. write every file into `checkpoints/.tmp-step-N-PID/`, fsync each file;
  2. write `manifest.json` (sha256 of each file + the run fingerprint) last, fsync, fsync dir;
  3. rename the folder to `checkpoints/step-N` and fsync `checkpoints/`;
  4. write `latest.tmp`, fsync, rename over `latest` and fsync again: now it is committed.
Loading verifies the manifest and the fingerprint; a checkpoint that fails either is
refused with the reason, and the next older one is tried.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from reprogate.utils.hashing import sha256_file
from reprogate.utils.pause import pause_if

# Fingerprint fields that must match to resume; others (packages, code, device) only warn.
MUST_MATCH = ("spec_hash", "data_hash", "labels_hash", "encoder_sha256")
MANIFEST = "manifest.json"


@dataclass
class Checkpoint:
    path: Path
    tensors: dict[str, dict[str, torch.Tensor]]  # file stem -> flat tensors
    meta: dict[str, Any]  # file stem -> JSON content
    fingerprint: dict[str, Any]


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, sort_keys=True, allow_nan=True)
        f.flush()
        os.fsync(f.fileno())


def save(
    ckpt_dir: Path,
    step: int,
    tensors: dict[str, dict[str, torch.Tensor]],
    meta: dict[str, Any],
    fingerprint: dict[str, Any],
    keep: int,
    hook: Callable[[str], None] | None = None,
) -> Path:
    """Write and commit one checkpoint; `hook(phase)` lets tests kill inside the protocol."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:08d}"
    tmp = ckpt_dir / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    files: dict[str, str] = {}
    for stem, group in tensors.items():
        path = tmp / f"{stem}.safetensors"
        save_file({k: v.detach().contiguous().cpu() for k, v in group.items()}, str(path))
        _fsync_file(path)
        files[path.name] = sha256_file(path)
        if hook:
            hook(f"wrote:{stem}")
    for stem, obj in meta.items():
        path = tmp / f"{stem}.json"
        _write_json(path, obj)
        files[path.name] = sha256_file(path)
    _write_json(tmp / MANIFEST, {"step": step, "files": files, "fingerprint": fingerprint})
    _fsync_dir(tmp)
    if hook:
        hook("before_rename")
    final = ckpt_dir / name
    if final.exists():  # left over from a run that was rolled back past it; not `latest`
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(ckpt_dir)
    pointer = ckpt_dir / "latest.tmp"
    pointer.write_text(name + "\n")
    _fsync_file(pointer)
    os.replace(pointer, ckpt_dir / "latest")
    _fsync_dir(ckpt_dir)
    _prune(ckpt_dir, keep, name)
    return final


def _prune(ckpt_dir: Path, keep: int, current: str) -> None:
    done = sorted(p for p in ckpt_dir.glob("step-*") if p.is_dir())
    for old in done[:-keep]:
        if old.name != current:
            shutil.rmtree(old, ignore_errors=True)
    for stale in ckpt_dir.glob(".tmp-step-*"):
        if not stale.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)


def verify(path: Path) -> dict[str, Any]:
    """Return the manifest if every file is present and matches its sha256, else raise."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise ValueError("no manifest.json (incomplete write)")
    manifest = json.loads(manifest_path.read_text())
    for fname, sha in manifest["files"].items():
        f = path / fname
        if not f.is_file():
            raise ValueError(f"{fname} is missing")
        actual = sha256_file(f)
        if actual != sha:
            raise ValueError(f"{fname} is corrupt (sha256 {actual[:12]}…, manifest says {sha[:12]}…)")
    return manifest


def read(path: Path) -> Checkpoint:
    manifest = verify(path)
    tensors, meta = {}, {}
    for fname in manifest["files"]:
        stem, ext = fname.rsplit(".", 1)
        if ext == "safetensors":
            tensors[stem] = load_file(str(path / fname))
        else:
            meta[stem] = json.loads((path / fname).read_text())
    return Checkpoint(path, tensors, meta, manifest["fingerprint"])


def candidates(ckpt_dir: Path) -> list[Path]:
    """The committed checkpoint first, then older ones, newest first."""
    if not ckpt_dir.is_dir():
        return []
    found = sorted((p for p in ckpt_dir.glob("step-*") if p.is_dir()), reverse=True)
    pointer = ckpt_dir / "latest"
    if pointer.is_file():
        latest = ckpt_dir / pointer.read_text().strip()
        # Anything newer than `latest` was never committed.
        found = [latest] + [p for p in found if p.name < latest.name] if latest in found else found
    return found


def load_checked(path: Path, fingerprint: dict[str, Any], log: Callable[[str], None]) -> Checkpoint | None:
    """The checkpoint at `path` if it verifies and belongs to this run, else None (said why)."""
    try:
        ckpt = read(path)
    except (ValueError, OSError, json.JSONDecodeError) as e:
        log(f"checkpoint {path} refused: {e}; trying the previous one")
        return None
    wrong = [k for k in MUST_MATCH if ckpt.fingerprint.get(k) != fingerprint.get(k)]
    if wrong:
        detail = ", ".join(
            f"{k} {str(ckpt.fingerprint.get(k))[:12]} != {str(fingerprint.get(k))[:12]}" for k in wrong
        )
        log(f"checkpoint {path} refused: it belongs to another run ({detail}); trying the previous one")
        return None
    return ckpt


def load_latest(ckpt_dir: Path, fingerprint: dict[str, Any], log: Callable[[str], None]) -> Checkpoint | None:
    """The newest checkpoint that verifies and belongs to this run, or None."""
    for path in candidates(ckpt_dir):
        if (ckpt := load_checked(path, fingerprint, log)) is not None:
            return ckpt
    return None


def environment_changes(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, list]:
    """Packages, code or device that differ between the checkpoint and this process."""
    a, b = saved.get("environment", {}), current.get("environment", {})
    changes = {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
    if saved.get("code_hash") != current.get("code_hash"):
        changes["code_hash"] = [saved.get("code_hash"), current.get("code_hash")]
    return changes


def resume_point(
    ckpt_dir: Path, fingerprint: dict[str, Any], total_steps: int, rank: int, log: Callable[[str], None]
) -> Checkpoint | None:
    """The checkpoint a run resumes from, or None to start afresh (clearing what is unusable).

    A finished run under other code or packages trains again: DVC reruns a finished run only
    when something changed, and here that was the code or the packages."""
    ckpt = load_latest(ckpt_dir, fingerprint, log)
    if ckpt is not None and ckpt.meta["trainer"]["global_step"] >= total_steps:
        changed = environment_changes(ckpt.fingerprint, fingerprint)
        if changed:
            log(
                f"the finished run in {ckpt.path} used other code or packages ({sorted(changed)}); "
                "training again from scratch"
            )
            ckpt = None
    if ckpt is None and ckpt_dir.exists() and any(ckpt_dir.iterdir()) and rank == 0:
        log(f"no usable checkpoint of this run in {ckpt_dir}; removing what is there and starting fresh")
        shutil.rmtree(ckpt_dir)
    return ckpt


class Checkpointer:
    """Trainer callback: a checkpoint every `every` updates, and on demand (the final state,
    a run stopped by its budget). Every rank gathers its state; rank 0 alone writes it. Then
    every rank calls `on_commit(folder or None, step)` (rank 0 gives the committed folder): how
    an executor that keeps its own record of checkpoints (Ray Train) hears of it."""

    def __init__(
        self,
        ckpt_dir: Path,
        every: int,
        keep: int,
        fingerprint: dict[str, Any],
        rank: int,
        on_commit: Callable[[Path | None, int], None] | None = None,
    ):
        self.dir, self.every, self.keep = ckpt_dir, every, keep
        self.fingerprint, self.rank, self.on_commit = fingerprint, rank, on_commit
        self.seconds = 0.0  # spent writing, for the run log's checkpoint_share
        self.saved_step: int | None = None

    def save(self, trainer) -> None:
        started = time.perf_counter()
        step = self.saved_step = trainer.progress.global_step
        tensors, meta = trainer.state()
        committed = None
        if self.rank == 0:  # state() gathered the other ranks' RNG and positions
            committed = save(
                self.dir,
                step,
                tensors,
                meta,
                self.fingerprint,
                self.keep,
                hook=lambda phase: pause_if(f"ckpt:{step}:{phase}"),
            )
        if self.on_commit is not None:
            self.on_commit(committed, step)
        self.seconds += time.perf_counter() - started

    def ensure_saved(self, trainer) -> None:
        if self.saved_step != trainer.progress.global_step:
            self.save(trainer)

    def on_update(self, trainer) -> None:
        step = trainer.progress.global_step
        if step % self.every == 0 and step < trainer.total_steps:
            self.save(trainer)
