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
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from reprogate.train import resume_check
from reprogate.utils.pause import PAUSE_ENV, PAUSE_RANK_ENV, PIDS_ENV
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
        "reprogate",
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


# Kill points of 2 ranks of TINY_NGRAM (12 updates of 2 micro-batches but every third, a
# checkpoint every 3): after an update, between the micro-batches of one, and, for rank 0 (the
# writer), inside a checkpoint write.
STEPS = [f"step:{n}" for n in range(1, 12)]
MICRO = [f"micro:{n}.1" for n in (1, 2, 4, 5, 7, 8, 10, 11)]
WRITES = [f"ckpt:{n}:{phase}" for n in (3, 6, 9, 12) for phase in ("wrote:model", "before_rename")]
KILLS = st.one_of(
    st.tuples(st.just(1), st.sampled_from(STEPS + MICRO)),
    st.tuples(st.just(0), st.sampled_from(STEPS + MICRO + WRITES)),
)


def _committed_before(kill_at: str) -> int:
    """The step of the last checkpoint committed when the run stops at `kill_at`."""
    kind, where = kill_at.split(":", 1)
    n = int(where.split(":")[0].split(".")[0])
    done = n if kind == "step" else n - 1  # inside update n, or inside the write of step n
    return 3 * (done // 3)


def _kill_one_rank(project: Path, reference: Path, work: Path, engine: str, rank: int, kill_at: str):
    spec = project / "specs" / "models" / f"{engine}.yaml"
    outcome = resume_check.kill_and_resume(project, engine, spec, work, kill_at, kill_rank=rank)
    assert outcome["kill"] == {**outcome["kill"], "killed": True, "rank": rank, "returncode": -9}
    assert (outcome["restarts"], outcome["restored_step"]) == (1, _committed_before(kill_at))
    fields = resume_check.compare(
        resume_check.final_checkpoint(reference), resume_check.final_checkpoint(work), tolerance=0.0
    )
    assert {k: f["verdict"] for k, f in fields.items()} == {k: "pass" for k in fields}


# No shrinking (each example is a run of 2 ranks): a failing kill point is reported as drawn.
NO_SHRINK = [Phase.explicit, Phase.generate]


@settings(
    max_examples=2,
    deadline=None,
    phases=NO_SHRINK,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(kill=KILLS)
@example(kill=(0, "ckpt:9:before_rename"))  # rank 0 killed inside a write, rank 1 waiting for it
def test_any_rank_killed_anywhere_is_restarted_by_the_elastic_agent_and_ends_bitwise(
    project, reference, tmp_path_factory, kill
):
    _kill_one_rank(project, reference, tmp_path_factory.mktemp("killed"), "ranks", *kill)


@settings(
    max_examples=1,
    deadline=None,
    phases=NO_SHRINK,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(kill=KILLS)  # one draw per session: a Ray worker group takes ~12 s to start here
def test_any_rank_killed_anywhere_is_restarted_by_ray_train_and_ends_bitwise(
    project, reference, tmp_path_factory, kill
):
    # The reference ran under the elastic agent: the engines compute the same run.
    _kill_one_rank(project, reference, tmp_path_factory.mktemp("killed"), "rays", *kill)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_torchrun_agents_on_loopback_are_two_nodes_of_one_run_and_recover_a_killed_rank(
    project, reference, tmp_path
):
    # What docs/distributed.md tells a Slurm or Kubernetes user to run on each node, here twice on
    # one machine: one rank per node, the run's folder shared. Rank 1 (node 1) is SIGKILLed after
    # update 5; both agents restart their workers, which resume from the checkpoint of step 3.
    work, pids = tmp_path / "work", tmp_path / "pids"
    pids.mkdir()
    endpoint = f"127.0.0.1:{_free_port()}"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
    torchrun += ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "two-nodes"]
    torchrun += ["--local-addr", "127.0.0.1", "--max-restarts", "1", "-m", "reprogate"]
    torchrun += ["stage", "train", "ranks", "--work-dir", str(work), "--skip-plan"]
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        PAUSE_ENV: "step:5",
        PAUSE_RANK_ENV: "1",
        PIDS_ENV: str(pids),
    }
    nodes = [
        subprocess.Popen(
            torchrun, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + 120
        while not (pids / "rank1.paused").exists():
            assert all(n.poll() is None for n in nodes) and time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(int((pids / "rank1.pid").read_text()), signal.SIGKILL)
        said = [n.communicate(timeout=180) for n in nodes]
    finally:
        for n in nodes:
            if n.poll() is None:
                n.kill()
    assert [n.returncode for n in nodes] == [0, 0], [err[-2000:] for _, err in said]
    assert sum(out.count("train: ranks: 12 steps on cpu in 2 processes") for out, _ in said) == 1
    # Only the agent whose worker died counts a restart; the other joins a new rendezvous
    # round, and that round may hand rank 0 to either node, so rank 0 says 0 or 1 restarts.
    run = json.loads((work / "run.jsonl").read_text().splitlines()[-1])["telemetry"]
    assert run["restarts"] in (0, 1) and run["resumed_from_step"] == 3
    fields = resume_check.compare(
        resume_check.final_checkpoint(reference), resume_check.final_checkpoint(work), tolerance=0.0
    )
    assert {k: f["verdict"] for k, f in fields.items()} == {k: "pass" for k in fields}


def test_ranks_stop_when_their_agent_is_killed(project, tmp_path):
    # Whatever ran the agent (dvc repro, resume_check, a shell) may be SIGKILLed with it; the
    # ranks, each in a session of its own, must not wait on in a collective.
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {PAUSE_ENV: "step:5", PAUSE_RANK_ENV: "1", PIDS_ENV: str(pids)}
    agent = _train(project, tmp_path / "work", env)
    try:
        deadline = time.monotonic() + 120
        while not (pids / "rank1.paused").exists():
            assert agent.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        ranks = [int((pids / f"rank{r}.pid").read_text()) for r in (0, 1)]
        agent.kill()
        agent.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in ranks):
            assert time.monotonic() < deadline, "a rank outlived its agent"
            time.sleep(0.1)
    finally:
        if agent.poll() is None:
            agent.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; only its parent (gone) would reap it.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")
