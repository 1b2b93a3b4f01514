"""Several ranks under PyTorch's elastic agent and under Ray Train: a killed rank is restarted by
the engine (with the whole worker group, from the last committed checkpoint) and the run ends
bitwise where an uninterrupted one under the elastic agent does; a rank failing past
max_restarts stops the run with its error. The Ray runs join one Ray on loopback, as a team's
runs join its cluster (RAY_ADDRESS), instead of each starting a Ray of its own."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from reprogate.train import resume_check
from tests.conftest import TINY_NGRAM, make_home_project, start_train, write_model_spec


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = make_home_project(tmp_path_factory.mktemp("elastic"))
    write_model_spec(root, "ranks", dict(TINY_NGRAM, processes=2, max_restarts=1))
    write_model_spec(root, "rays", dict(TINY_NGRAM, processes=2, max_restarts=1, executor="ray"))
    return root


# A Ray held by a driver process of its own: stopping that process stops exactly this Ray, never
# another one on the machine (`ray stop` would stop them all).
HOLD_RAY = (
    "import sys, ray; ray.init(address='local', num_cpus=2, num_gpus=0, include_dashboard=False, "
    "_temp_dir=sys.argv[1]); "
    "print(ray.get_runtime_context().gcs_address, flush=True); sys.stdin.read()"
)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[dict[str, str]]:
    """The environment that joins it: its address, and the token its control plane requires
    (Ray starts a local cluster with token authentication on; a team's cluster has its own)."""
    temp = tempfile.mkdtemp(prefix="rg-ray-")  # short: Ray's socket paths have a length limit
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    # Ray takes the machine's network address for 127.0.0.1 and listens on every interface
    # unless told to make a loopback node (docs/distributed.md).
    loopback = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_RAY, temp],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **auth, **loopback},
    )
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.append(holder.stdout.readline().strip()), daemon=True)
    reader.start()
    reader.join(timeout=120)
    try:
        assert said and said[0], "a Ray on loopback did not start within 120 s"
        yield {"RAY_ADDRESS": said[0], **auth}
    finally:
        holder.stdin.close()  # the holder's driver ends, and with it its Ray
        try:
            holder.wait(timeout=60)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def reference(project, tmp_path_factory) -> Path:
    """An uninterrupted run of the same spec in 2 ranks."""
    work = tmp_path_factory.mktemp("reference") / "work"
    proc = start_train(project, work, dict(os.environ), "ranks")
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


@pytest.mark.long  # docs/testing.md: `make test-long`, run by CI
@settings(
    max_examples=1,
    deadline=None,
    phases=NO_SHRINK,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(kill=KILLS)  # one draw per session: a Ray worker group takes ~12 s to start here
def test_any_rank_killed_anywhere_is_restarted_by_ray_train_and_ends_bitwise(
    project, reference, tmp_path_factory, ray_cluster, kill
):
    # The reference ran under the elastic agent: the engines compute the same run.
    with pytest.MonkeyPatch.context() as env:
        for k, v in ray_cluster.items():
            env.setenv(k, v)
        _kill_one_rank(project, reference, tmp_path_factory.mktemp("killed"), "rays", *kill)


# A driver whose rank 1 fails at every attempt while rank 0 waits for it (as in a collective),
# in a process of its own: Ray reads the cluster's token once per process, when it loads.
BROKEN_RANK = """
import json, os, sys, time
from pathlib import Path
from reprogate.specs.model import ModelSpec
from reprogate.train import ray_engine
from reprogate.utils.errors import UserError

def broken(seconds):
    if os.environ["RANK"] == "1":
        raise RuntimeError("rank 1 broke")
    time.sleep(seconds)
    return {}

spec = ModelSpec.model_validate(json.loads(sys.argv[1]))
try:
    ray_engine.launch(spec, Path(sys.argv[2]), Path(sys.argv[3]), broken, (60.0,))
except UserError as e:
    print(e)
    sys.exit(2)
"""


@pytest.mark.long  # docs/testing.md: `make test-long`, run by CI
def test_a_ray_rank_failing_past_max_restarts_stops_the_run_with_its_error(tmp_path, ray_cluster):
    # Restarts themselves are the property above's.
    spec = dict(TINY_NGRAM, processes=2, executor="ray", max_restarts=0)
    args = [json.dumps(spec), str(tmp_path / "m.yaml"), str(tmp_path / "run")]
    proc = subprocess.run(
        [sys.executable, "-c", BROKEN_RANK, *args],
        env={**os.environ, **ray_cluster},
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = proc.stdout.strip()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert said.startswith(f"{tmp_path / 'm.yaml'}: Ray Train worker 1 of 2 failed: ")
    assert "rank 1 broke" in said and "after 0 restart(s)" in said and "Traceback" not in said
    assert int((tmp_path / "run" / "ray" / "attempts" / "rank1").read_text()) == 1
