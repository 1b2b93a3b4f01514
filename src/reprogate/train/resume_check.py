"""What stage `resume_check@m` runs: the supervisor that trains a reference run, kills a run at
an update, resumes it and compares the two final states bitwise
(pipeline/stages/resume_check.py declares it to DVC)."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from reprogate.records import runlog
from reprogate.records.base import write
from reprogate.records.resume import ResumeMetrics, ResumeRecord
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from reprogate.train import checkpoint
from reprogate.utils import paths
from reprogate.utils.console import say
from reprogate.utils.errors import UserError
from reprogate.utils.pause import PAUSE_ENV, PAUSE_RANK_ENV, PIDS_ENV

# Bitwise on CPU and (deterministic) CUDA; MPS kernels give no such promise.
TOLERANCE = {"cpu": 0.0, "cuda": 0.0, "mps": 1e-5}


def derived_spec(spec: ModelSpec) -> dict[str, Any]:
    rc = spec.resume_check
    d = spec.model_dump(mode="json")
    d.update(steps=rc.steps, epochs=None)
    d["budget"]["train_minutes"] = None  # a planned length is the real run's, not the check's
    if rc.kill_rank is not None:  # the engine must restart the killed rank at least once
        d["max_restarts"] = max(1, spec.max_restarts)
    d["checkpoint"] = {"every_steps": rc.checkpoint_every, "keep": spec.checkpoint.keep}
    return d


def run_child(
    root: Path,
    name: str,
    spec_path: Path,
    work: Path,
    pause_at: str | None = None,
    timeout: float = 1800,
    kill_rank: int | None = None,
) -> dict[str, Any]:
    """Run the training entry point as a separate process; SIGKILL it at `pause_at` (with
    `kill_rank`, only that rank, and wait for the engine to finish the run)."""
    cmd = [
        sys.executable,
        "-m",
        "reprogate",
        "stage",
        "train",
        name,
        "--spec",
        str(spec_path),
        "--work-dir",
        str(work),
        "--skip-plan",
    ]
    env = {k: v for k, v in os.environ.items() if k not in (PAUSE_ENV, PAUSE_RANK_ENV)}
    if pause_at:
        env[PAUSE_ENV] = pause_at
    if kill_rank is not None:
        env[PAUSE_RANK_ENV] = str(kill_rank)
    log_path = work.parent / f"{work.name}.log"
    with open(log_path, "ab") as log, tempfile.TemporaryDirectory(prefix="reprogate-pids-") as pids:
        env[PIDS_ENV] = pids
        # Its own process group; ranks under the elastic agent each have a session of their own
        # and are killed by the process ids they wrote, right after the agent (no restart).
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=log, start_new_session=True)
        try:
            return _supervise(proc, pause_at, log_path, timeout, Path(pids), kill_rank)
        finally:
            _kill_group(proc, Path(pids))


def _kill_group(proc: subprocess.Popen, pids: Path) -> None:
    if proc.poll() is None:  # once reaped, its pid (and group id) may belong to someone else
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    for f in sorted(pids.glob("rank*.pid")):
        with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
            os.killpg(int(f.read_text()), signal.SIGKILL)  # each worker leads its own session
    proc.wait()


def _supervise(
    proc: subprocess.Popen,
    pause_at: str | None,
    log_path: Path,
    timeout: float,
    pids: Path,
    kill_rank: int | None = None,
) -> dict[str, Any]:
    """Wait for the child; with `pause_at`, kill it once rank 0 (or `kill_rank`) stops there.
    A rank says so by a file beside its process id, not on stdout: under the elastic agent its
    output reaches this process through the agent, buffered."""
    deadline = time.monotonic() + timeout
    paused = pids / f"rank{kill_rank or 0}.paused"
    killed: dict[str, Any] | None = None
    while proc.poll() is None:
        if pause_at and killed is None and paused.exists():
            if kill_rank is None:
                _kill_group(proc, pids)
                return {"killed": True, "at": pause_at, "returncode": proc.returncode}
            pid = int((pids / f"rank{kill_rank}.pid").read_text())
            os.kill(pid, signal.SIGKILL)
            killed = {"killed": True, "at": pause_at, "rank": kill_rank, "pid": pid, "returncode": -9}
        if time.monotonic() > deadline:
            _kill_group(proc, pids)
            raise UserError(
                f"resume_check: the training child did not finish within {timeout:g} s; it said: "
                f"{_last_line(log_path)} (whole log: {log_path})"
            )
        time.sleep(0.02)
    if pause_at and killed is None:
        raise UserError(
            f"resume_check: the training run ended (exit {proc.returncode}) before reaching "
            f"the kill point {pause_at}; it said: {_last_line(log_path)} (whole log: {log_path})"
        )
    if proc.returncode != 0:
        raise UserError(
            f"resume_check: training child failed (exit {proc.returncode})"
            + (f" after rank {kill_rank} was killed" if killed else "")
            + f"; it said: {_last_line(log_path)} (whole log: {log_path})"
        )
    return killed or {"killed": False, "returncode": 0}


def _last_line(log_path: Path) -> str:
    """The child's last words: its error message (a UserError) or the last line of a traceback."""
    with open(log_path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
        lines = [x.strip() for x in f.read().decode(errors="replace").splitlines() if x.strip()]
    return lines[-1] if lines else "nothing"


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape or a.dtype != b.dtype:
        return float("inf")
    if torch.equal(a, b):
        return 0.0
    return float((a.double() - b.double()).abs().max())


def _json_diff(a: Any, b: Any) -> float:
    """0.0 when equal; for numbers and number lists the largest difference; else inf."""
    if a == b:
        return 0.0
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return abs(float(a) - float(b))
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return max(_json_diff(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return max((_json_diff(a[k], b[k]) for k in a), default=0.0)
    return float("inf")


def compare(ref: checkpoint.Checkpoint, other: checkpoint.Checkpoint, tolerance: float) -> dict[str, Any]:
    def tensors(group: str) -> float:
        a, b = ref.tensors.get(group, {}), other.tensors.get(group, {})
        if a.keys() != b.keys():
            return float("inf")
        return max((_max_diff(a[k], b[k]) for k in a), default=0.0)

    ra, rb = ref.meta["trainer"], other.meta["trainer"]
    diffs = {
        "model": tensors("model"),
        "optimizer": max(tensors("optimizer"), _json_diff(ref.meta["optimizer"], other.meta["optimizer"])),
        "scheduler": _json_diff(ref.meta["scheduler"], other.meta["scheduler"]),
        "grad_scaler": _json_diff(ref.meta["scaler"], other.meta["scaler"]),
        "rng": max(tensors("rng"), _json_diff(ref.meta["rng"], other.meta["rng"])),
        "global_step": _json_diff(ra["global_step"], rb["global_step"]),
        "epoch": _json_diff(ra["epoch"], rb["epoch"]),
        "sampler_position": _json_diff(ra["position"], rb["position"]),
        "loss_record": _json_diff(ra["losses"], rb["losses"]),
        "lr_record": _json_diff(ra["lrs"], rb["lrs"]),
    }
    if ra.get("evals") or rb.get("evals"):  # a language model's validation points
        diffs["validation_points"] = _json_diff(ra.get("evals"), rb.get("evals"))
    return {
        k: {
            "max_abs_diff": v if math.isfinite(v) else "inf",  # inf: shapes, keys or values differ
            "tolerance": tolerance,
            "verdict": "pass" if v <= tolerance else "fail",
        }
        for k, v in diffs.items()
    }


def final_checkpoint(work: Path) -> checkpoint.Checkpoint:
    ckpt_dir = work / "checkpoints"
    found = checkpoint.candidates(ckpt_dir)
    if not found:
        raise UserError(f"resume_check: no checkpoint in {ckpt_dir}")
    return checkpoint.read(found[0])


def kill_and_resume(
    root: Path, name: str, spec_path: Path, work: Path, pause_at: str, kill_rank: int | None = None
) -> dict[str, Any]:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    killed = run_child(root, name, spec_path, work, pause_at=pause_at, kill_rank=kill_rank)
    if kill_rank is not None:  # the engine restarted the group and the run went on to the end
        entries, _ = runlog.read(work / "run.jsonl")
        told = entries[-1].telemetry if entries else {}
        restarts = int(told.get("restarts") or 0)
        return {"kill": killed, "restored_step": told.get("resumed_from_step") or 0, "restarts": restarts}
    committed = checkpoint.candidates(work / "checkpoints")
    restored = checkpoint.read(committed[0]).meta["trainer"]["global_step"] if committed else 0
    run_child(root, name, spec_path, work)
    return {"kill": killed, "restored_step": restored, "restarts": 0}


def _engine(spec: ModelSpec) -> str:
    if spec.executor == "ray":
        return "ray"
    return "torch-elastic" if spec.processes > 1 else "in-process"


def check(root: Path, name: str, log=None) -> dict[str, Any]:
    log = log or say
    spec_path = root / paths.model_spec(name)
    spec = load_spec(spec_path, ModelSpec)
    rc = spec.resume_check
    base = root / paths.RESUME_CHECKS / name
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    short = base / f"{name}.yaml"
    short.write_text(yaml.safe_dump(derived_spec(spec), sort_keys=False))
    started = time.perf_counter()

    log(f"resume_check: reference run of {rc.steps} updates")
    (base / "reference").mkdir()
    run_child(root, name, short, base / "reference")
    ref = final_checkpoint(base / "reference")
    device = ref.fingerprint["environment"]["device"].split(":")[0]
    tolerance = TOLERANCE.get(device, 0.0)

    engine, rank = _engine(spec), rc.kill_rank
    if rank is None:
        log(f"resume_check: killed run (SIGKILL after update {rc.kill_after}), then resume")
        cause = f"SIGKILL of every process after update {rc.kill_after}; the run started again"
    else:
        log(f"resume_check: rank {rank} killed after update {rc.kill_after}; {engine} restarts it")
        cause = f"SIGKILL of rank {rank} after update {rc.kill_after}; {engine} restarted the worker group"
    outcome = kill_and_resume(root, name, short, base / "killed", f"step:{rc.kill_after}", rank)
    resumed = final_checkpoint(base / "killed")
    fields = compare(ref, resumed, tolerance)
    restarted = rank is None or outcome["restarts"] >= 1
    passed = (
        all(f["verdict"] == "pass" for f in fields.values())
        and outcome["kill"]["returncode"] == -9
        and restarted
    )
    result = {
        "passed": passed,
        "device": device,
        "processes": spec.processes,
        "engine": engine,
        "killed_rank": rank,
        "restarts": outcome["restarts"],
        "cause": cause,
        "tolerance": tolerance,
        "steps": rc.steps,
        "checkpoint_every": rc.checkpoint_every,
        "killed_after_step": rc.kill_after,
        "kill_signal": "SIGKILL",
        "child_returncode": outcome["kill"]["returncode"],
        "restored_step": outcome["restored_step"],
        "final_step": resumed.meta["trainer"]["global_step"],
        "fields": fields,
    }
    record = ResumeRecord.model_validate(result)
    write(root / paths.results_dir(name) / "resume.json", record)
    write(root / paths.metrics_dir(name) / "resume.json", ResumeMetrics.of(record))
    if passed:
        shutil.rmtree(base)  # large, and everything worth keeping is in resume.json
    return {**result, "wall_s": round(time.perf_counter() - started, 2)}


def summary(name: str, r: dict[str, Any]) -> str:
    bad = [k for k, f in r["fields"].items() if f["verdict"] != "pass"]
    if r.get("killed_rank") is not None and r.get("restarts", 0) < 1:
        bad.append("the restart")
    verdict = (
        "PASSED (bitwise equal)"
        if r["passed"] and r["tolerance"] == 0
        else ("PASSED" if r["passed"] else f"FAILED on {', '.join(bad) or 'the kill'}")
    )
    who = (
        f"rank {r['killed_rank']} of {r['processes']} ({r['engine']}, {r['restarts']} restart(s)) "
        if r.get("killed_rank") is not None
        else (f"{r['processes']} processes " if r.get("processes", 1) > 1 else "")
    )
    return (
        f"resume_check: {name}: {who}killed after step {r['killed_after_step']}, restored step "
        f"{r['restored_step']}, final step {r['final_step']}: {verdict} in {r['wall_s']:.1f} s"
    )
