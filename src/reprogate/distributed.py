"""Training in several processes (ranks) on one machine: launch, gradient sync, state gathering.

A spec with `processes: N` makes `reprogate stage train` start N copies of itself with the
environment torchrun would set (RANK, WORLD_SIZE, MASTER_ADDR, ...); a launch by torchrun
itself works the same. The ranks average their gradients with an all-reduce after each update,
so every rank holds the same model, and rank 0 writes checkpoints holding every rank's RNG
state and sampler position. gloo on CPU, NCCL on CUDA. With one process nothing here runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from reprogate.errors import UserError

# How long rank 0 may take to finish after another rank failed, before it is stopped too (a
# rank 0 blocked in a collective on the failed rank would otherwise wait forever).
RANK0_GRACE_S = 5.0


def launch(root: Path, argv: list[str], processes: int, spec_path: Path) -> str:
    """Run `reprogate <argv>` as `processes` ranks and wait for all of them. Rank 0 speaks for
    the run (its output is this process's); a rank that fails stops the others."""
    with socket.socket() as s:  # a free port for the ranks' rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs: list[subprocess.Popen] = []
    with contextlib.ExitStack() as stack:
        logs = [None] + [stack.enter_context(tempfile.TemporaryFile()) for _ in range(processes - 1)]
        try:
            for rank in range(processes):
                env = dict(
                    os.environ,
                    RANK=str(rank),
                    LOCAL_RANK=str(rank),
                    WORLD_SIZE=str(processes),
                    LOCAL_WORLD_SIZE=str(processes),
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port),
                )
                # All ranks are on this machine: gloo over loopback, not whatever the hostname
                # resolves to (a container's may not be reachable).
                env.setdefault("GLOO_SOCKET_IFNAME", "lo0" if sys.platform == "darwin" else "lo")
                cmd = [sys.executable, "-m", "reprogate.cli", *argv]
                procs.append(subprocess.Popen(cmd, cwd=root, env=env, stdout=logs[rank], stderr=logs[rank]))
            while True:
                codes = [p.poll() for p in procs]
                failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
                if failed or all(c == 0 for c in codes):
                    break
                time.sleep(0.1)
            if failed and failed[0] != 0:
                # Ranks that stop together (over budget, say) fail within moments of each other:
                # rank 0's own message is the run's, so it gets a moment to finish and say it,
                # rather than a race deciding whose words the user reads (or reads twice).
                with contextlib.suppress(subprocess.TimeoutExpired):
                    procs[0].wait(timeout=RANK0_GRACE_S)
                codes = [p.poll() for p in procs]
                failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        finally:
            for p in procs:
                if p.poll() is None:  # the others would wait on a failed rank forever
                    p.send_signal(signal.SIGKILL)
                    p.wait()
        if not failed:
            return ""  # rank 0 printed the run's summary
        rank = failed[0]
        if rank == 0:
            raise SystemExit(codes[0])  # rank 0 has said why, as a single process would
        logs[rank].seek(0)
        said = logs[rank].read().decode(errors="replace").strip().splitlines()
    raise UserError(
        f"{spec_path}: training process {rank} of {processes} failed (exit {codes[rank]})"
        + (f": {said[-1]}" if said else "")
        + "; the others were stopped. The last committed checkpoint is kept for the next run."
    )


def init(device: torch.device) -> None:
    """Join the process group of this launch (environment from `launch` or torchrun)."""
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")


def close() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def average_gradients(params: list[torch.nn.Parameter], world: int) -> None:
    """Every rank ends with the mean of all ranks' gradients (one flat all-reduce)."""
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def mean(value: float, device: torch.device, world: int) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item() / world)


def gather(obj: Any, world: int) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    dist.barrier()
