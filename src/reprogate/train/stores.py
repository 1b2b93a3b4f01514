"""torch's key-value stores (the rendezvous, a process group's meeting point) listening on one
address only.

A TCPStore server listens on every interface, whatever address it is given: that address is
only where clients look. The ranks of a run on one machine meet on loopback, so a store here is
served on a socket bound to the address itself (`master_listen_fd`), and the elastic agent's
rendezvous is one of ours ("reprogate-loopback") built on such a store.
"""

from __future__ import annotations

import os
import socket
import sys
from datetime import timedelta

import torch.distributed as dist
from torch.distributed import TCPStore

LOOPBACK_RENDEZVOUS = "reprogate-loopback"
LOOPBACK_INTERFACE = "lo0" if sys.platform == "darwin" else "lo"
TIMEOUT = dist.constants.default_pg_timeout  # gloo's and torch's own, for joins and reads


def serve(address: str, port: int = 0, timeout: timedelta = TIMEOUT) -> TCPStore:
    """A store server listening on `address` only (port 0: any free one; `.port` says which)."""
    family, kind, proto, _, where = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(where)
    listener.listen(128)
    bound = listener.getsockname()[1]
    # The store owns the descriptor from here: detached, Python will not close it under it.
    return TCPStore(
        address,
        bound,
        is_master=True,
        timeout=timeout,
        wait_for_workers=False,
        multi_tenant=True,
        master_listen_fd=listener.detach(),
    )


def sockets_on_loopback() -> None:
    """gloo's and NCCL's sockets on the loopback interface, whatever the caller's environment
    names: every rank of a run started here is on this machine, and a GLOO_SOCKET_IFNAME=eth0
    left in a shell would otherwise put its listeners on the network."""
    os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = LOOPBACK_INTERFACE


def join(address: str, port: int, world_size: int, timeout: timedelta = TIMEOUT) -> TCPStore:
    """A client of the store served at address:port (a rank other than 0)."""
    return TCPStore(address, port, world_size, is_master=False, timeout=timeout)


def process_group_store(rank: int, world_size: int) -> TCPStore:
    """The store of a launch's process group at MASTER_ADDR:MASTER_PORT (as `env://` reads it),
    served by rank 0 on that address alone."""
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if rank == 0:
        return serve(address, port)
    return join(address, port, world_size)


def _loopback_rendezvous(params):
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    class Loopback(C10dRendezvousBackend):
        @property
        def name(self) -> str:  # the registry checks that a handler is the one it asked for
            return LOOPBACK_RENDEZVOUS

    store = serve("127.0.0.1")
    return create_handler(store, Loopback(store, params.run_id), params)


def register_loopback_rendezvous() -> str:
    """The elastic agent's rendezvous for ranks on this machine alone; returns its name."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(LOOPBACK_RENDEZVOUS, _loopback_rendezvous)
    return LOOPBACK_RENDEZVOUS
