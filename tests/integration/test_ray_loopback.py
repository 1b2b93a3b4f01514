"""A run of several ranks on one machine listens on loopback only: under Ray (a Ray that
reprogate starts for the run: the GCS, the raylet, its agents, the workers, the Train controller,
the driver, and the ranks' process-group store) and under the elastic agent (its rendezvous, the
ranks' store, gloo). Read from the process table while the run trains, not from anyone's own
account of its addresses."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import TINY_NGRAM, make_home_project, write_model_spec


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


def _train_watching_sockets(root, work, env) -> set[tuple[int, str, str, int]]:
    cmd = [
        sys.executable,
        "-m",
        "reprogate",
        "stage",
        "train",
        "ranks",
        "--work-dir",
        str(work),
        "--skip-plan",
    ]
    proc = subprocess.Popen(
        cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
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
    return seen | {(proc.pid, "driver", "", 0)}


# A Ray of its own takes ~45 s to start and stop here: `make test-long` (docs/testing.md), run by CI.
@pytest.mark.parametrize("executor", [pytest.param("ray", marks=pytest.mark.long), "torch"])
def test_the_ranks_of_a_run_and_a_ray_of_its_own_listen_on_loopback_only(tmp_path, executor):
    root = make_home_project(tmp_path / "project")
    write_model_spec(root, "ranks", dict(TINY_NGRAM, processes=2, executor=executor))
    # Even where the environment asks Ray for a node reachable from elsewhere.
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"
    seen = _train_watching_sockets(root, tmp_path / "work", env)
    driver = next(pid for pid, name, _, _ in seen if name == "driver")
    names = {name for _, name, _, _ in seen}
    # The look saw the servers themselves, so an empty answer cannot pass for a loopback one:
    # Ray's GCS and raylet, or the elastic agent's rendezvous store (in the driver).
    if executor == "ray":
        assert {"gcs_server", "raylet"} <= names, sorted(seen)
    else:
        assert any(pid == driver and port for pid, _, _, port in seen), sorted(seen)
    beyond = sorted(s for s in seen if s[3] and not _is_loopback(s[2]))
    assert beyond == [], beyond
