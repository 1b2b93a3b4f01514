"""Several ranks under PyTorch's elastic agent and under Ray Train: a killed rank is restarted by
the engine (with the whole worker group, from the last committed checkpoint) and the run ends
bitwise where an uninterrupted one under the elastic agent does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reprogate.pause import PAUSE_ENV, PAUSE_RANK_ENV, PIDS_ENV
from reprogate.stages import resume_check
from tests.conftest import TINY_NGRAM, make_home_project, write_model_spec


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = make_home_project(tmp_path_factory.mktemp("elastic"))
    write_model_spec(root, "ranks", dict(TINY_NGRAM, processes=2, max_restarts=1))
    write_model_spec(root, "rays", dict(TINY_NGRAM, processes=2, max_restarts=1, executor="ray"))
    return root


def _train(root: Path, work: Path, env: dict[str, str], name: str = "ranks") -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "reprogate.cli",
        "stage",
        "train",
        name,
        "--work-dir",
        str(work),
        "--skip-plan",
    ]
    return subprocess.Popen(
        cmd, cwd=root, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.fixture(scope="module")
def reference(project, tmp_path_factory) -> Path:
    """An uninterrupted run of the same spec in 2 ranks."""
    work = tmp_path_factory.mktemp("reference") / "work"
    proc = _train(project, work, {})
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    return work


@pytest.mark.parametrize(
    ("engine", "rank", "kill_at", "restored"),
    [("ranks", 1, "step:5", 3), ("ranks", 0, "step:7", 6), ("rays", 1, "step:7", 6)],
    ids=["elastic-rank1", "elastic-rank0", "ray-rank1"],
)
def test_a_killed_rank_is_restarted_by_the_engine_and_resumes_bitwise(
    project, reference, tmp_path, engine, rank, kill_at, restored
):
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {PAUSE_ENV: kill_at, PAUSE_RANK_ENV: str(rank), PIDS_ENV: str(pids)}
    killed = tmp_path / "killed"
    proc = _train(project, killed, env, engine)
    try:
        deadline = time.monotonic() + 120
        while not (pids / f"rank{rank}.paused").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        os.kill(int((pids / f"rank{rank}.pid").read_text()), signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.count(f"train: {engine}: 12 steps") == 1
    run = json.loads((killed / "run.jsonl").read_text().splitlines()[-1])["telemetry"]
    assert (run["restarts"], run["resumed_from_step"]) == (1, restored)
    fields = resume_check.compare(
        resume_check.final_checkpoint(reference), resume_check.final_checkpoint(killed), tolerance=0.0
    )
    assert {k: f["verdict"] for k, f in fields.items()} == {k: "pass" for k in fields}
