"""Training ranks as Ray Train workers (`executor: ray`): the same loop, the same checkpoints.

With `executor: ray`, `reprogate stage train` is the driver. It joins the cluster at
`ray.address` (or RAY_ADDRESS), or starts a Ray of this run alone on loopback (its files under
the run's folder), and runs `processes` TorchTrainer workers. Ray sets up the process group
(gloo on CPU, NCCL on CUDA) and the rank environment; each worker runs the train stage's own
function. Every checkpoint rank 0 commits in the run's folder is handed to `ray.train.report`
by all ranks together (a barrier), so Ray Train holds the last state every rank reached; after
a worker dies it restarts the group (FailureConfig.max_failures) and the workers resume from
`ray.train.get_checkpoint()`. Across launches a run resumes from its own checkpoint folder, as
under the elastic agent. On several machines the project folder must be shared by all of them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from reprogate.runtime import numerics
from reprogate.train import checkpoint, stores
from reprogate.utils.atomic import write_file
from reprogate.utils.errors import UserError
from reprogate.utils.pause import ATTEMPT_ENV

IN_WORKER_ENV = "REPROGATE_RAY_WORKER"
# What a worker needs from the driver's environment (a cluster's workers do not inherit it).
FORWARDED = (
    "REPROGATE_", "HF_", "TRANSFORMERS_", "CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED",
    *numerics.VARIABLES,  # a worker of a cluster started elsewhere gets the pin at its start
)  # fmt: skip


def in_worker() -> bool:
    return os.environ.get(IN_WORKER_ENV) == "1"


def report(path: Path | None, step: int) -> None:
    """Called by every rank once a checkpoint is committed (rank 0 gives its folder)."""
    import ray.train

    ckpt = ray.train.Checkpoint.from_directory(str(path)) if path is not None else None
    ray.train.report({"step": step}, checkpoint=ckpt, delete_local_checkpoint_after_upload=False)


def restored(fingerprint: dict[str, Any], log: Callable[[str], None]) -> checkpoint.Checkpoint | None:
    """The state Ray Train restarted this worker group from, if it did."""
    import ray.train

    ckpt = ray.train.get_checkpoint()
    if ckpt is None:
        return None
    with ckpt.as_directory() as folder:
        return checkpoint.load_checked(Path(folder), fingerprint, log)


def launch(
    spec, spec_path: Path, run_dir: Path, loop: Callable[..., dict[str, Any] | None], args: tuple
) -> dict[str, Any]:
    """Run `loop(*args)` on `spec.processes` Ray Train workers and wait; returns rank 0's result."""
    if _address(spec):  # the driver itself: on loopback unless this environment says otherwise
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    else:
        _own_ray_on_loopback()  # before ray is imported: it reads the variable once
    os.environ.setdefault("RAY_TRAIN_METRICS_ENABLED", "0")  # Prometheus metrics nobody scrapes
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")  # or each line is said twice
    # The controller takes the ranks' reports (and sees a dead worker) when it polls them: every
    # 2 s by default, and a report waits for the one before it to be taken.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from reprogate.train.ray_store import BoundTorchConfig

    folder = run_dir.resolve() / "ray"
    # Each launch is a Ray Train run of its own; what it resumes from is the run's checkpoints.
    for old in ("storage", "attempts"):
        shutil.rmtree(folder / old, ignore_errors=True)
    (folder / "result.json").unlink(missing_ok=True)
    (folder / "attempts").mkdir(parents=True)
    gpu = _uses_gpu(spec)
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED)}
    trainer = TorchTrainer(
        _worker,
        train_loop_config={"loop": loop, "args": args, "folder": str(folder)},
        torch_config=BoundTorchConfig(backend="nccl" if gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=spec.processes, use_gpu=gpu),
        run_config=RunConfig(
            name="train",
            storage_path=str(folder / "storage"),
            failure_config=FailureConfig(max_failures=spec.max_restarts),
            checkpoint_config=CheckpointConfig(num_to_keep=spec.checkpoint.keep),
            worker_runtime_env={"env_vars": env},
            logging_config=_quiet(),
        ),
    )
    with _session(spec, spec_path, folder, gpu):
        try:
            trainer.fit()
        except Exception as e:  # Ray's errors: WorkerGroupError, ControllerError
            raise _failure(e, spec, spec_path) from None
    return json.loads((folder / "result.json").read_text())


def _worker(config: dict[str, Any]) -> None:
    import ray.train

    _quiet_worker()
    rank = ray.train.get_context().get_world_rank()
    counter = Path(config["folder"], "attempts", f"rank{rank}")
    attempt = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(attempt + 1))
    os.environ[ATTEMPT_ENV] = str(attempt)
    os.environ[IN_WORKER_ENV] = "1"
    result = config["loop"](*config["args"])
    if rank == 0:
        write_file(Path(config["folder"], "result.json"), json.dumps(result).encode())


class _NoUserErrorTraceback(logging.Filter):
    """A reprogate error is one paragraph for the user, said by the driver; a crash keeps its
    traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"{UserError.__module__}.{UserError.__name__}: " not in record.getMessage()


def _quiet_worker() -> None:
    from ray.train.v2._internal import util
    from ray.train.v2._internal.execution import context

    # Ray Train's line for every report of every rank says nothing the run's progress does not.
    logging.getLogger(context.__file__).setLevel(logging.WARNING)
    logging.getLogger(util.__name__).addFilter(_NoUserErrorTraceback())


def _quiet():
    """Ray's own lines at ERROR and above: the run's progress and summary are rank 0's to say."""
    import ray

    return ray.LoggingConfig(log_level="ERROR")


def _uses_gpu(spec) -> bool:
    if spec.device == "auto":
        import torch

        return torch.cuda.is_available()
    return spec.device == "cuda"


@contextlib.contextmanager
def _session(spec, spec_path: Path, folder: Path, gpu: bool) -> Iterator[None]:
    import ray

    address = _address(spec)
    quiet = _quiet()
    if address:
        _wait_for(address, spec.ray.connect_timeout_s, spec_path)
        try:
            ray.init(address=address, logging_config=quiet)
        except Exception as e:
            raise UserError(
                f"{spec_path}: field 'ray.address' (or RAY_ADDRESS) is {address!r}, and joining the "
                f"cluster there failed: {_first_line(e)}. Check the address of its head (`ray status` "
                "there); a cluster with Ray's token authentication also needs RAY_AUTH_MODE=token and "
                "its RAY_AUTH_TOKEN in this environment. Or remove the address to run on a Ray of "
                "this run alone."
            ) from None
        try:
            yield
        finally:
            ray.shutdown()
        return
    with _short_link(folder / "tmp") as tmp:
        try:
            ray.init(
                address="local",
                num_cpus=max(os.cpu_count() or 1, spec.processes),
                num_gpus=None if gpu else 0,
                include_dashboard=False,
                _temp_dir=tmp,
                logging_config=quiet,
            )
        except Exception as e:
            raise UserError(
                f"{spec_path}: executor ray could not start a Ray of its own on loopback: "
                f"{_first_line(e)}. Its logs are in {folder / 'tmp'}. Check that ports can be "
                "bound on 127.0.0.1, or give ray.address of a running cluster."
            ) from None
        try:
            _refuse_beyond_loopback(spec_path)
            yield
        finally:
            ray.shutdown()


def _address(spec) -> str | None:
    return spec.ray.address or os.environ.get("RAY_ADDRESS")


def _own_ray_on_loopback() -> None:
    """A Ray of the run's own serves nobody else: its node address is 127.0.0.1, which every Ray
    process binds to (Ray would take the machine's network address and listen on all interfaces),
    and gloo's and NCCL's sockets are on the loopback interface too."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray's switch for a loopback node
    stores.sockets_on_loopback()


def _refuse_beyond_loopback(spec_path: Path) -> None:
    """Ray reads its switch once, when it loads: a process that loaded it earlier would not."""
    import ray

    node = ray.util.get_node_ip_address()
    if not ipaddress.ip_address(node).is_loopback:
        raise UserError(
            f"{spec_path}: executor ray started a Ray of its own at {node}, not on loopback: Ray "
            "was loaded in this process before the run set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0. "
            "Run `reprogate stage train` in a process of its own, or give ray.address of a "
            "cluster you have bound yourself (docs/distributed.md)."
        )


@contextlib.contextmanager
def _short_link(target: Path) -> Iterator[str]:
    """Ray's temporary folder, under the run's folder, by a short path: its sockets live there,
    and a socket path longer than 107 bytes cannot be bound."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    link = Path(tempfile.mkdtemp(prefix="rg-ray-")) / "t"
    link.symlink_to(target)
    try:
        yield str(link)
    finally:
        shutil.rmtree(link.parent, ignore_errors=True)


def _wait_for(address: str, timeout: float, spec_path: Path) -> None:
    """Refuse, after `timeout` seconds, an address where nothing answers (Ray itself would retry
    for minutes)."""
    if address == "auto":
        return  # ray reads the address of this machine's running cluster itself
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(
            f"{spec_path}: field 'ray.address' (or RAY_ADDRESS) is {address!r}; give HOST:PORT of "
            "the cluster's head (e.g. 10.0.0.5:6379) or ray://HOST:10001."
        )
    deadline, error = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, int(port)), timeout=min(2.0, timeout)):
                return
        except OSError as e:
            error = e
            time.sleep(0.2)
    raise UserError(
        f"{spec_path}: field 'ray.address' (or RAY_ADDRESS) is {address!r}, and nothing answered "
        f"there within {timeout:g} s ({error}). Start the cluster (`ray start --head` on that "
        "machine), correct the address, or remove it to run on a Ray of this run alone."
    )


def _failure(e: Exception, spec, spec_path: Path) -> UserError:
    failures = getattr(e, "worker_failures", None) or {}
    for error in failures.values():
        if isinstance(error, UserError):
            return UserError(str(error))  # the rank's own paragraph (all ranks say the same)
    if failures:
        rank = min(failures)
        said = _first_line(failures[rank])
        return UserError(
            f"{spec_path}: Ray Train worker {rank} of {spec.processes} failed: {said} (after "
            f"{spec.max_restarts} restart(s), max_restarts); the others were stopped. The last "
            "committed checkpoint is kept for the next run."
        )
    return UserError(f"{spec_path}: the Ray Train run failed: {_first_line(e)}")


def _first_line(e: BaseException) -> str:
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return lines[0] if lines else type(e).__name__
