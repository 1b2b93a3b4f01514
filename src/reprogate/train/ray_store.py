"""Ray Train's torch setup, with the process group's store bound to one address: rank 0's node
address (127.0.0.1 in a Ray that reprogate starts for a run), never every interface.

Ray Train's own TorchConfig lets rank 0 start torch's TCPStore, and a TCPStore server listens on
all interfaces whatever MASTER_ADDR says. Here rank 0 serves it on its node address alone
(stores.serve) and the other ranks join it there. The rest (the ranks' environment,
the device, shutdown) is Ray Train's TorchConfig as it is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import ray
import torch.distributed as dist
from ray.train.torch import TorchConfig
from ray.train.torch.config import _set_torch_distributed_env_vars, _TorchBackend

from reprogate.train import stores

# Rank 0's store, held for as long as its worker process lives.
_held: dict[str, Any] = {}


def _host() -> tuple[str, int]:
    address = ray.util.get_node_ip_address()
    store = stores.serve(address)
    _held["store"] = store
    return address, store.port


def _join(backend: str, address: str, port: int, timeout_s: int) -> None:
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=timeout_s)
    store = _held["store"] if rank == 0 else stores.join(address, port, world_size, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


class _BoundBackend(_TorchBackend):
    def on_start(self, worker_group, backend_config: BoundTorchConfig) -> None:
        worker_group.execute(_set_torch_distributed_env_vars)  # RANK, LOCAL_RANK, WORLD_SIZE, …
        timeout = backend_config.timeout_s
        address, port = worker_group.execute_single(0, _host)
        joins = [
            worker_group.execute_single_async(i, _join, backend_config.backend, address, port, timeout)
            for i in range(len(worker_group))
        ]
        ray.get(joins)


@dataclass
class BoundTorchConfig(TorchConfig):
    """TorchConfig whose process group meets on rank 0's node address only (`backend` given)."""

    @property
    def backend_cls(self):
        return _BoundBackend
