"""Small contracts of the training engine that must hold for every input."""

from __future__ import annotations

import os

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from reprogate import checkpoint
from reprogate.runtime import configure_mps_env
from reprogate.specs import ModelSpec
from reprogate.trainer import EpochSampler, lr_factor


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
