"""A run of several ranks on one machine listens on loopback only: under Ray (a Ray that
reprogate starts for the run: the GCS, the raylet, its agents, the workers, the Train controller,
the driver, and the ranks' process-group store) and under the elastic agent (its rendezvous, the
ranks' store, gloo). Read from the process table while the run trains, not from anyone's own
account of its addresses."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import TINY_NGRAM, make_home_project, start_train, write_model_spec


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is IPv4's loopback
    return (mapped or address).is_loopback


def _listening(root: psutil.Process) -> set[tuple[int, str, str, int]]:
    """(pid, process name, address, port) of every TCP listener in `root`'s tree, now."""
    found = set()
    try:
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return found
    for proc in tree:
        try:
            name = proc.name()
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.add((proc.pid, name, conn.laddr.ip, conn.laddr.port))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # a worker that ended between the listing and the look
    return found


def _network_interface() -> tuple[str, str]:
    """A non-loopback interface of this machine with its IPv4 address."""
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family == socket.AF_INET and not _is_loopback(a.address):
                return name, a.address
    pytest.skip("this machine has no network interface besides loopback")


def _train_watching_sockets(root, work, env) -> tuple[int, set[tuple[int, str, str, int]]]:
    """(the driver's pid, every listener seen in its process tree while it trained)."""
    proc = start_train(root, work, env, "ranks", stderr=subprocess.STDOUT)
    seen: set[tuple[int, str, str, int]] = set()
    driver = psutil.Process(proc.pid)
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= _listening(driver)
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
    said = proc.communicate()[0]
    assert proc.returncode == 0, said[-3000:]
    return proc.pid, seen


# A Ray of its own takes ~45 s to start and stop here: `make test-long` (docs/testing.md), run by CI.
@pytest.mark.parametrize("executor", [pytest.param("ray", marks=pytest.mark.long), "torch"])
def test_the_ranks_of_a_run_and_a_ray_of_its_own_listen_on_loopback_only(tmp_path, executor):
    root = make_home_project(tmp_path / "project")
    write_model_spec(root, "ranks", dict(TINY_NGRAM, processes=2, executor=executor))
    # Even where the environment asks Ray for a node reachable from elsewhere, and names the
    # machine's network interface for gloo's and NCCL's sockets (a shell left from a cluster job).
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"
    interface, address = _network_interface()
    env |= {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface, "MASTER_ADDR": address}
    driver, seen = _train_watching_sockets(root, tmp_path / "work", env)
    names = {name for _, name, _, _ in seen}
    # The look saw the servers themselves, so an empty answer cannot pass for a loopback one:
    # Ray's GCS and raylet, or the elastic agent's rendezvous store (in the driver).
    if executor == "ray":
        assert {"gcs_server", "raylet"} <= names, sorted(seen)
    else:
        assert any(pid == driver for pid, _, _, _ in seen), sorted(seen)
    beyond = sorted(s for s in seen if not _is_loopback(s[2]))
    assert beyond == [], beyond


# Ray loaded before the run could make its node a loopback one: the run is refused, not exposed.
LOADED_EARLY = """
import json, sys
from pathlib import Path
import ray  # reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1 now, once
from reprogate.specs.model import ModelSpec
from reprogate.train import ray_engine
from reprogate.utils.errors import UserError

spec = ModelSpec.model_validate(json.loads(sys.argv[1]))
try:
    ray_engine.launch(spec, Path(sys.argv[2]), Path(sys.argv[3]), print, ())
except UserError as e:
    print(e)
    sys.exit(2)
"""


@pytest.mark.long  # docs/testing.md: `make test-long`, run by CI
def test_a_ray_that_would_not_be_on_loopback_is_refused_before_any_rank_starts(tmp_path):
    spec = dict(TINY_NGRAM, processes=2, executor="ray")
    args = [json.dumps(spec), str(tmp_path / "m.yaml"), str(tmp_path / "run")]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", LOADED_EARLY, *args], env=env, capture_output=True, text=True, timeout=300
    )
    said = proc.stdout.strip().splitlines()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert said[-1].startswith(f"{tmp_path / 'm.yaml'}: executor ray started a Ray of its own at ")
    assert "not on loopback" in said[-1] and "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "ray" / "attempts" / "rank0").exists()  # no rank ever ran
