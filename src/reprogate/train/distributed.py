"""Training in several processes (ranks): launched by PyTorch's elastic agent, gradient sync,
state gathering.

A spec with `processes: N` (and `executor: torch`, the default; Ray's is ray_engine.py) makes
`reprogate stage train` run N copies of itself under
`torch.distributed.launcher.api.elastic_launch`: c10d rendezvous on loopback, process
supervision and restarts (`max_restarts`) are PyTorch's. A launch by `torchrun` itself, on one
machine or several, works the same. The ranks average their gradients with an all-reduce after
each update, so every rank holds the same model, and rank 0 writes checkpoints holding every
rank's RNG state and sampler position; a restarted worker group resumes from the last committed
one. gloo on CPU, NCCL on CUDA. With one process nothing here runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from reprogate.train import stores
from reprogate.utils.errors import UserError
from reprogate.utils.pause import PIDS_ENV


def launch(root: Path, argv: list[str], processes: int, spec_path: Path, max_restarts: int = 0) -> str:
    """Run `reprogate <argv>` as `processes` ranks under the elastic agent and wait. Rank 0
    speaks for the run (its output is this process's); the others' goes to files, and the last
    line of a failed one is the error."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):  # its own lines would repeat ours
            logging.getLogger(name).setLevel(logging.CRITICAL)
    # All ranks are on this machine: gloo over loopback, not whatever the hostname resolves to
    # or the caller's environment names.
    stores.sockets_on_loopback()
    # A store of its own for every attempt: on the rendezvous store shared across restarts (the
    # default), a restarted group's gloo ranks read the dead attempt's addresses and time out.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    with tempfile.TemporaryDirectory(prefix="reprogate-ranks-") as logs:
        config = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=processes,
            run_id=uuid.uuid4().hex,
            rdzv_backend=stores.register_loopback_rendezvous(),  # c10d's, on 127.0.0.1 only
            rdzv_endpoint="127.0.0.1:0",
            local_addr="127.0.0.1",
            max_restarts=max_restarts,
            monitor_interval=0.1,
            # Rank 0 to the console and a file (tee), the others to files only.
            logs_specs=DefaultLogsSpecs(
                log_dir=logs, redirects={r: Std.ALL for r in range(1, processes)}, tee={0: Std.ALL}
            ),
            shutdown_timeout=5,
        )
        try:
            # The agent starts workers in its own folder: the project's, as `root` says.
            with contextlib.chdir(root):
                elastic_launch(config, sys.executable)("-m", "reprogate", *argv)
            return ""  # rank 0 printed the run's summary
        except ChildFailedError as e:
            failures = e.failures
            if 0 in failures and failures[0].exitcode > 0:
                raise SystemExit(failures[0].exitcode) from None  # rank 0 has said why
            rank = min(failures, key=lambda r: failures[r].timestamp)
            code = failures[rank].exitcode
            said = _last_line(Path(logs), rank)
            # Ranks that stop together (over budget, say) say the same; rank 0 has said it.
            if said and any(
                said in p.read_text(errors="replace") for p in Path(logs).glob("*/attempt_*/0/stderr.log")
            ):
                raise SystemExit(code if code > 0 else 1) from None
    raise UserError(
        f"{spec_path}: training process {rank} of {processes} failed (exit {code})"
        + (f": {said}" if said else "")
        + f" after {max_restarts} restart(s); the others were stopped. The last committed "
        "checkpoint is kept for the next run."
    )


def _last_line(logs: Path, rank: int) -> str:
    """The last line rank `rank` wrote in its last attempt (the agent keeps one folder each)."""
    attempts = sorted(logs.glob(f"*/attempt_*/{rank}/stderr.log"), key=lambda p: int(p.parts[-3][8:]))
    for path in reversed(attempts):
        lines = path.read_text(errors="replace").strip().splitlines()
        if lines:
            return lines[-1]
    return ""


def record_pid(rank: int) -> None:
    if folder := os.environ.get(PIDS_ENV):
        Path(folder, f"rank{rank}.pid").write_text(str(os.getpid()))


def init(device: torch.device, agent_is_parent: bool = True) -> None:
    """Join the process group of this launch (environment from `launch` or torchrun); a Ray
    Train worker is in its group already."""
    record_pid(int(os.environ.get("RANK", "0")))
    if agent_is_parent:
        _exit_with_parent()
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":  # the agent serves the store
        dist.init_process_group(backend)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = stores.process_group_store(rank, world)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=stores.TIMEOUT)


def _exit_with_parent() -> None:
    """A rank whose agent has died (killed with whatever ran it) stops too, rather than wait in
    a collective for the others until gloo's 30-minute timeout: the agent is its parent, and
    the agent starts every rank in a session of its own, so nothing else would stop it."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="reprogate-agent-watch", daemon=True).start()


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
