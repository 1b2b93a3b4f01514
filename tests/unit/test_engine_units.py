"""Small contracts of the training engine that must hold for every input."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reprogate.runtime.device import configure_mps_env
from reprogate.specs.model import ModelSpec
from reprogate.train import checkpoint
from reprogate.train.trainer import EpochSampler, lr_factor
from reprogate.utils.atomic import remove_stale, replace_dir


@given(
    n=st.integers(1, 500),
    micro=st.integers(1, 64),
    world=st.integers(1, 4),
    epoch=st.integers(0, 50),
    seed=st.integers(0, 2**32 - 1),
)
def test_ranks_take_equal_disjoint_shards_of_each_epoch(n, micro, world, epoch, seed):
    # Equal shards, so every rank takes part in every update; only the last n mod world of the
    # epoch's order sit it out (none with one process).
    order = EpochSampler(n, n, seed).batches(epoch)[0]
    shards = []
    for rank in range(world):
        s = EpochSampler(n, micro, seed, rank, world)
        batches = s.batches(epoch)
        assert len(batches) == s.micro_batches_per_epoch()
        assert all(0 < len(b) <= micro for b in batches)
        shards.append([int(i) for b in batches for i in b])
    assert all(len(sh) == n // world for sh in shards)
    assert sorted(i for sh in shards for i in sh) == sorted(int(i) for i in order[: n - n % world])
    if world == 1:
        assert sorted(shards[0]) == list(range(n))  # every example once per epoch


@given(n=st.integers(2, 300), seed=st.integers(0, 1000))
def test_epoch_order_is_a_pure_function_of_seed_and_epoch(n, seed):
    a, b = EpochSampler(n, 7, seed), EpochSampler(n, 7, seed)
    for e in (0, 1, 5):
        assert all(np.array_equal(x, y) for x, y in zip(a.batches(e), b.batches(e), strict=True))


@given(
    kind=st.sampled_from(["constant", "linear", "cosine"]), total=st.integers(1, 5000), warm=st.floats(0, 0.5)
)
def test_learning_rate_factor_stays_in_range(kind, total, warm):
    f = lr_factor(kind, round(warm * total), total)
    values = [f(s) for s in range(total)]
    assert all(0.0 <= v <= 1.0 for v in values)


def test_mps_watermarks_reach_pytorch_environment(monkeypatch):
    monkeypatch.delenv("PYTORCH_MPS_HIGH_WATERMARK_RATIO", raising=False)
    spec = ModelSpec.model_validate(
        {
            "kind": "model",
            "data": "x",
            "family": "ngram",
            "ngram": {},
            "steps": 5,
            "checkpoint": {"every_steps": 5},
            "mps": {"high_watermark_ratio": 1.3, "low_watermark_ratio": 1.1},
        }
    )
    configure_mps_env(spec)
    assert os.environ["PYTORCH_MPS_HIGH_WATERMARK_RATIO"] == "1.3"
    assert os.environ["PYTORCH_MPS_LOW_WATERMARK_RATIO"] == "1.1"


def test_package_change_is_reported_not_refused():
    saved = {
        "spec_hash": "a",
        "data_hash": "b",
        "labels_hash": "c",
        "code_hash": "x",
        "environment": {"torch": "2.12.0", "numpy": "2.4.6", "device": "cpu"},
    }
    now = dict(saved, environment={"torch": "2.13.0", "numpy": "2.4.6", "device": "cpu"})
    assert checkpoint.environment_changes(saved, now) == {"torch": ["2.12.0", "2.13.0"]}


def test_a_folder_whose_writer_was_killed_is_kept_whole_and_its_leftovers_removed(tmp_path):
    out = tmp_path / "features" / "m"
    out.mkdir(parents=True)
    (out / "old.txt").write_text("old")
    # A writer killed by SIGKILL halfway: no cleanup code runs in it.
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, signal, sys; from pathlib import Path\n"
            "from reprogate.utils.atomic import replace_dir\n"
            "with replace_dir(Path(sys.argv[1])) as tmp:\n"
            "    (tmp / 'half.txt').write_text('half')\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n",
            str(out),
        ]
    )
    assert killed.returncode == -9
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".m.tmp-")], "leftover expected"
    assert (out / "old.txt").read_text() == "old"

    with pytest.raises(RuntimeError), replace_dir(out) as tmp:
        (tmp / "new.txt").write_text("new")
        raise RuntimeError("a failing writer")
    assert sorted(p.name for p in out.parent.iterdir()) == ["m"]  # its own temp gone, the dead one's too
    assert (out / "old.txt").read_text() == "old"

    with replace_dir(out) as tmp:
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["m"]


def test_a_live_writers_folder_is_left_alone(tmp_path):
    out = tmp_path / "m"
    live = tmp_path / f".m.tmp-{os.getppid()}"  # our parent: alive while we run
    live.mkdir()
    remove_stale(out)
    assert live.is_dir()


@pytest.mark.parametrize("rank0_after_s", [0.0, 0.5])
def test_ranks_that_fail_together_are_reported_once(tmp_path, monkeypatch, capfd, rank0_after_s):
    # Ranks over budget all stop at one update. The elastic agent stops the others as soon as
    # one fails: the user reads the message once, from rank 0 when it got to say it, else from
    # the launcher quoting the rank that failed.
    from reprogate.train import distributed
    from reprogate.utils.errors import UserError

    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$RANK" = 0 ]; then sleep ' + str(rank0_after_s) + '; echo "over budget" >&2; exit 2; fi\n'
        'echo "over budget" >&2; exit 2\n'
    )
    fake.chmod(0o755)
    monkeypatch.setattr(distributed.sys, "executable", str(fake))
    try:
        distributed.launch(tmp_path, ["stage", "train", "m"], 2, tmp_path / "m.yaml")
        pytest.fail("a failed rank must fail the launch")
    except SystemExit as stopped:
        assert stopped.code == 2 and capfd.readouterr().err.count("over budget") == 1
    except UserError as e:
        assert "failed (exit 2): over budget" in str(e) and "over budget" not in capfd.readouterr().err
    # A rank 0 that does not finish (blocked on the failed rank) is stopped by the agent, and the
    # failed rank's last line is the error.
    fake.write_text('#!/bin/sh\nif [ "$RANK" = 0 ]; then sleep 60; fi\necho "rank 1 broke" >&2; exit 3\n')
    with pytest.raises(UserError, match=r"training process 1 of 2 failed \(exit 3\): rank 1 broke"):
        distributed.launch(tmp_path, ["stage", "train", "m"], 2, tmp_path / "m.yaml")


def _broken_rank(seconds: float) -> dict:
    """A rank 1 that fails at every attempt while rank 0 waits for it (as in a collective)."""
    import time as clock

    if os.environ["RANK"] == "1":
        raise RuntimeError("rank 1 broke")
    clock.sleep(seconds)
    return {}


def _ray_spec(**fields):
    from reprogate.specs.model import ModelSpec
    from tests.conftest import TINY_NGRAM

    return ModelSpec.model_validate(dict(TINY_NGRAM, processes=2, executor="ray", **fields))


def test_a_ray_address_where_nothing_answers_is_refused_in_bounded_time(tmp_path):
    import socket
    import time as clock

    from reprogate.train import ray_engine
    from reprogate.utils.errors import UserError

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = _ray_spec(ray={"address": f"127.0.0.1:{port}", "connect_timeout_s": 1.0})
    started = clock.monotonic()
    with pytest.raises(
        UserError,
        match=rf"field 'ray.address' \(or RAY_ADDRESS\) is '127.0.0.1:{port}', and "
        r"nothing answered there within 1 s",
    ):
        ray_engine.launch(spec, tmp_path / "m.yaml", tmp_path / "run", _broken_rank, (0.0,))
    assert clock.monotonic() - started < 10


def test_a_ray_ranks_reprogate_error_is_said_as_it_is_and_without_its_traceback(tmp_path):
    # A budget stop inside a worker: the user reads that paragraph (as under the elastic agent),
    # not Ray's wrapping of it nor the worker's traceback; a crash keeps its traceback.
    import logging

    from ray.train import WorkerGroupError

    from reprogate.train import ray_engine
    from reprogate.utils.errors import UserError

    said = f"{tmp_path / 'm.yaml'}: training stopped at update 1 of 12: peak memory passed the budget"
    failure = WorkerGroupError("worker errors", {1: UserError(said), 0: RuntimeError("collective aborted")})
    assert str(ray_engine._failure(failure, _ray_spec(), tmp_path / "m.yaml")) == said

    def record(text: str) -> logging.LogRecord:
        return logging.LogRecord("ray", logging.ERROR, __file__, 1, text, None, None)

    quiet = ray_engine._NoUserErrorTraceback()
    assert not quiet.filter(
        record(f"Error in training function:\nTraceback ...\nreprogate.utils.errors.UserError: {said}")
    )
    assert quiet.filter(record("Error in training function:\nTraceback ...\nRuntimeError: rank 1 broke"))
