"""Real Home Assistant (pytest-homeassistant-custom-component) and a real `reprogate serve`.

The server is the project's own: its Python (.venv, 3.11) builds a small project from the home
fixture (tests_home_assistant/build_server_project.py) and serves it on loopback, once per
session; every test gets Home Assistant with this repository's custom_components/reprogate.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_socket

REPO = Path(__file__).resolve().parents[1]
PYTHON = Path(os.environ.get("REPROGATE_PYTHON", REPO / ".venv" / "bin" / "python"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A running `reprogate serve`, its project folder, and its access log."""

    url: str
    root: Path
    log: Path
    proc: subprocess.Popen
    versions: dict[str, str]

    def predict_requests(self) -> int:
        """How many POST /predict the server has answered (uvicorn's access log)."""
        return self.log.read_text(errors="replace").count('"POST /predict')

    def healthz(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/healthz", timeout=5) as r:
            return json.loads(r.read())

    def promote(self, name: str) -> str:
        subprocess.run(
            [str(PYTHON), str(REPO / "tests_home_assistant" / "build_server_project.py"), "--promote", name],
            cwd=self.root,
            check=True,
            capture_output=True,
        )
        return self.versions[name]


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Iterator[Server]:
    if not PYTHON.is_file():
        pytest.fail(f"{PYTHON} is missing: run `make venv` first (make test-home-assistant does)")
    root = tmp_path_factory.mktemp("reprogate") / "home"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO / "src")}
    built = subprocess.run(
        [str(PYTHON), str(REPO / "tests_home_assistant" / "build_server_project.py"), str(root)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    versions = json.loads(built.stdout.strip().splitlines()[-1])
    pytest_socket.enable_socket()  # the plugin blocks new sockets; connections stay loopback-only
    port = free_port()
    log = root.parent / "serve.log"
    reprogate = PYTHON.parent / "reprogate"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(reprogate), "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=root,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    s = Server(f"http://127.0.0.1:{port}", root, log, proc, versions)
    deadline = time.monotonic() + 120
    while True:
        try:
            s.healthz()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("reprogate serve did not start:\n" + log.read_text(errors="replace"))
            time.sleep(0.2)
    try:
        yield s
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)  # a test that paused it must not leave it stopped
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(autouse=True)
def auto_enable_custom_integrations(enable_custom_integrations, socket_enabled):
    """Home Assistant loads custom_components/ only when a test asks for it; sockets are
    allowed, to 127.0.0.1 only (the plugin's socket_allow_hosts), for the real server."""
    yield
