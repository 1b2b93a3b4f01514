"""The language-model pipeline end to end (`dvc repro` of lm/ in a temporary copy): the committed
plan, whole-split scoring, resume at any kill point, report and registry, promote, generate and
serve. Unit by unit: tests/unit/test_lm_units.py."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from reprogate.train import resume_check
from tests.conftest import (
    BIN,
    OLDER_CPU,
    REPO,
    TINY_GPT,
    TINY_TEXT,
    as_another_machine,
    copy_project,
    git_cmd,
    run_cli,
    stages_run,
)

FIXTURE = REPO / "tests" / "fixtures" / "lm" / "corpus.txt"


def _dvc(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([str(BIN / "dvc"), *args], cwd=root, env=env, capture_output=True, text=True)
    assert not check or proc.returncode == 0, f"dvc {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def lm_project(tmp_path_factory) -> Path:
    """A copy of the repository whose lm/ pipeline runs a tiny model on the fixture corpus."""
    repo = copy_project(tmp_path_factory.mktemp("lm"))
    lm = repo / "lm"
    (lm / "raw").mkdir()
    (lm / "raw" / "corpus.txt").write_bytes(FIXTURE.read_bytes())
    text = {**TINY_TEXT, "samples": {"prompts": ["The ", "A"], "max_new_tokens": 12, "seed": 3}}
    (lm / "specs" / "data" / "tiny.yaml").write_text(yaml.safe_dump(text, sort_keys=False))
    (lm / "specs" / "models" / "gpt.yaml").write_text(yaml.safe_dump(TINY_GPT, sort_keys=False))
    gate = {"kind": "gate", "thresholds": {"val_bits_per_char_max": 6.0}}  # a few seconds of training
    (lm / "specs" / "gate.yaml").write_text(yaml.safe_dump(gate, sort_keys=False))
    params = yaml.safe_load((lm / "params.yaml").read_text())
    (lm / "params.yaml").write_text(
        yaml.safe_dump(dict(params, data="specs/data/tiny.yaml"), sort_keys=False)
    )
    run_cli("compile", cwd=lm, check=True)
    _dvc(lm, "repro", "tokenize@gpt")
    said = run_cli("plan", "gpt", "--write", cwd=lm, check=True).stdout
    assert "wrote specs/models/gpt.plan.yaml" in said
    _dvc(lm, "repro")
    git_cmd(repo, "add", "-A")
    git_cmd(repo, "commit", "-qm", "tiny lm, reproduced")
    return lm


def test_lm_pipeline_trains_the_planned_steps_and_scores_the_whole_split(lm_project):
    plan = yaml.safe_load((lm_project / "specs" / "models" / "gpt.plan.yaml").read_text())
    train = json.loads((lm_project / "metrics" / "gpt" / "train.json").read_text())
    assert train["steps"] == plan["steps"] and train["tokens_seen"] == plan["steps"] * 8 * 16
    ev = json.loads((lm_project / "results" / "gpt" / "eval.json").read_text())
    tokens = json.loads((lm_project / "data" / "tokens" / "gpt" / "manifest.json").read_text())
    val = ev["sets"]["validation"]
    assert val["n_tokens"] == tokens["parts"]["validation"]["tokens"] - 1  # every token but the first
    assert val["bits_per_char"] == pytest.approx(
        val["nats_per_token"] * val["n_tokens"] / math.log(2) / val["n_chars"]
    )
    assert 0 < val["bits_per_char"] < math.log2(300) * 2
    samples = [
        json.loads(x) for x in (lm_project / "predictions" / "gpt" / "samples.jsonl").read_text().splitlines()
    ]
    assert [s["prompt"] for s in samples] == ["The ", "A"]
    curve = (lm_project / "plots" / "gpt" / "validation_by_seconds.tsv").read_text().splitlines()
    assert curve[0] == "step\ttokens\tseconds\tnats_per_token" and len(curve) == 3
    resume = json.loads((lm_project / "results" / "gpt" / "resume.json").read_text())
    assert resume["passed"] and resume["tolerance"] == 0.0 and "validation_points" in resume["fields"]
    gate = json.loads((lm_project / "results" / "gate.json").read_text())
    rules = {r["rule"]: r["verdict"] for r in gate["candidates"]["gpt"]["rules"]}
    assert rules == {
        "val_bits_per_char": "pass",
        "resume_equivalence": "pass",
        "not_worse_than_production": "n/a",
    }


def test_lm_rerun_changes_nothing_and_a_new_plan_retrains(lm_project):
    out = _dvc(lm_project, "repro").stdout
    assert stages_run(out) == [], out
    assert git_cmd(lm_project.parent, "status", "--porcelain") == ""  # every record: the same bytes
    plan_file = lm_project / "specs" / "models" / "gpt.plan.yaml"
    plan = yaml.safe_load(plan_file.read_text())
    plan_file.write_text(yaml.safe_dump(dict(plan, steps=plan["steps"] + 2), sort_keys=False))
    try:
        status = json.loads(_dvc(lm_project, "status", "--json").stdout)
        assert "train@gpt" in status and "tokenize@gpt" not in status
    finally:
        git_cmd(lm_project.parent, "checkout", "--", "lm/specs")


def test_a_stale_or_missing_plan_is_refused_with_the_fix(lm_project, tmp_path):
    spec = yaml.safe_load((lm_project / "specs" / "models" / "gpt.yaml").read_text())
    spec["causal_lm"]["d_model"] = 32
    (lm_project / "specs" / "models" / "gpt.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    try:
        said = run_cli("stage", "train", "gpt", "--work-dir", str(tmp_path / "w"), cwd=lm_project)
        assert (
            said.returncode == 2
            and "is stale" in said.stderr
            and "plan specs/models/gpt.yaml --write" in said.stderr
        )
        (lm_project / "specs" / "models" / "gpt.plan.yaml").rename(tmp_path / "plan.yaml")
        said = run_cli("stage", "train", "gpt", "--work-dir", str(tmp_path / "w"), cwd=lm_project)
        assert said.returncode == 2 and "needs a measured number of updates" in said.stderr
        assert "Traceback" not in said.stderr
    finally:
        git_cmd(lm_project.parent, "checkout", "--", "lm/specs")


def test_report_and_registry_read_a_language_models_records(lm_project, tmp_path):
    # The copy's first commit holds this repository's own lm/ records; the fixture's commit the
    # tiny model's. Every number is checked against the files of each commit.
    repo = lm_project.parent
    base = json.loads(git_cmd(repo, "show", "HEAD~1:lm/results/gpt/eval.json"))
    head = json.loads((lm_project / "results" / "gpt" / "eval.json").read_text())
    run_cli("report", "--base", "HEAD~1", "--out", str(tmp_path / "r"), cwd=lm_project, check=True)
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    row = next(r for r in report["metrics"] if (r["set"], r["metric"]) == ("validation", "bits_per_char"))
    want_base, want_head = (
        base["sets"]["validation"]["bits_per_char"],
        head["sets"]["validation"]["bits_per_char"],
    )
    assert (row["base"], row["head"]) == (want_base, want_head)
    assert row["better"] == (want_head < want_base)
    gate = json.loads((lm_project / "results" / "gate.json").read_text())
    assert report["gate"]["head"]["chosen"] == gate["chosen"] == "gpt"
    assert report["paired"]["gpt"]["paired"] is False and "language model" in report["paired"]["gpt"]["why"]
    lock = (repo / "requirements.lock").read_bytes()
    assert report["environment"]["head"]["requirements_lock_sha256"] == hashlib.sha256(lock).hexdigest()

    run_cli("registry", "sync", cwd=lm_project, check=True)
    sql = lambda q: json.loads(run_cli("registry", "sql", q, "--json", cwd=lm_project, check=True).stdout)  # noqa: E731
    (run,) = sql("SELECT family, steps, heldout_set, heldout_accuracy FROM runs")
    train = json.loads((lm_project / "metrics" / "gpt" / "train.json").read_text())
    assert run == {
        "family": "causal_lm",
        "steps": train["steps"],
        "heldout_set": "validation",
        "heldout_accuracy": None,
    }
    values = {
        (r["set"], r["metric"]): r["value"] for r in sql('SELECT "set", metric, value FROM evaluations')
    }
    assert values[("validation", "bits_per_char")] == want_head
    assert values[("model", "parameters")] == head["parameters"]
    curve = (lm_project / "plots" / "gpt" / "train.tsv").read_text().splitlines()
    assert sql("SELECT count(*) AS n FROM metrics")[0]["n"] == 2 * (len(curve) - 1)


# The kill-point property of tests/integration/test_train.py, for the language model's objective: 8 updates
# of 2 micro-batches, a checkpoint every 3, validation points (the whole split) at 4 and 8.
LM_EVERY, LM_STEPS = 3, 8
LM_KILLS = st.one_of(
    st.integers(1, LM_STEPS - 1).map(lambda k: f"step:{k}"),
    st.integers(1, LM_STEPS).map(lambda k: f"micro:{k}.1"),
    st.sampled_from([LM_EVERY, 2 * LM_EVERY]).flatmap(
        lambda k: st.sampled_from(
            [f"ckpt:{k}:wrote:model", f"ckpt:{k}:wrote:optimizer", f"ckpt:{k}:before_rename"]
        )
    ),
)


@pytest.fixture(scope="module")
def lm_reference(lm_project):
    spec = load_spec(lm_project / "specs" / "models" / "gpt.yaml", ModelSpec)
    derived = resume_check.derived_spec(spec)
    derived.update(steps=LM_STEPS, grad_accum=2, checkpoint={"every_steps": LM_EVERY, "keep": 2})
    base = lm_project / "runs" / "kill-points"  # git-ignored
    (base / "reference").mkdir(parents=True)
    spec_path = base / "gpt.yaml"
    spec_path.write_text(yaml.safe_dump(derived, sort_keys=False))
    assert resume_check.run_child(lm_project, "gpt", spec_path, base / "reference")["returncode"] == 0
    return spec_path, resume_check.final_checkpoint(base / "reference")


@settings(
    max_examples=1,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each example is a training run
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(kill_at=LM_KILLS)
@example(kill_at="micro:4.1")  # between the micro-batches of the update a validation point follows
@example(kill_at="ckpt:6:wrote:optimizer")  # inside a checkpoint write
def test_a_language_model_killed_anywhere_resumes_bitwise(lm_project, lm_reference, kill_at):
    spec_path, reference = lm_reference
    work = spec_path.parent / "killed"
    outcome = resume_check.kill_and_resume(lm_project, "gpt", spec_path, work, kill_at)
    assert outcome["kill"]["returncode"] == -9
    killed_step = int(kill_at.split(":")[1].split(".")[0])
    assert (
        outcome["restored_step"]
        == (killed_step - (0 if kill_at.startswith("step") else 1)) // LM_EVERY * LM_EVERY
    )
    fields = resume_check.compare(reference, resume_check.final_checkpoint(work), tolerance=0.0)
    assert "validation_points" in fields
    assert {k: f["verdict"] for k, f in fields.items()} == {k: "pass" for k in fields}


def test_promote_generate_and_serve_a_language_model(lm_project):
    from fastapi.testclient import TestClient

    from reprogate.serve.app import create_app

    repo = lm_project.parent
    said = run_cli("promote", cwd=lm_project, check=True).stdout
    assert "gpt" in said
    record = json.loads((lm_project / "models" / "production.json").read_text())
    assert record["family"] == "causal_lm" and record["val_bits_per_char"] > 0
    assert "heldout_accuracy" not in record and "calibration" not in record
    assert json.loads((repo / "models" / "production.json").read_text()).get("family") != "causal_lm"
    assert git_cmd(repo, "log", "-1", "--format=%s").startswith("promote gpt (gpt@")

    one = run_cli("generate", "The ", "--max-tokens", "12", "--seed", "4", cwd=lm_project, check=True)
    two = run_cli("generate", "The ", "--max-tokens", "12", "--seed", "4", cwd=lm_project, check=True)
    assert one.stdout == two.stdout and one.stdout.startswith("The ") and "12 tokens" in one.stderr
    bad = run_cli("generate", "The ", "--max-tokens", "5000", cwd=lm_project)
    assert bad.returncode == 2 and "ask for 1 to 2000" in bad.stderr and "Traceback" not in bad.stderr
    wrong = run_cli("generate", "hello", cwd=repo)  # the classifier's project
    assert wrong.returncode == 2 and "use `reprogate predict` there" in wrong.stderr

    with TestClient(create_app(lm_project, watch_interval=3600)) as c:
        r = c.post("/generate", json={"prompt": "A", "max_tokens": 8, "seed": 1})
        assert r.status_code == 200 and r.json()["tokens"] == 8
        assert r.json()["model_version"] == record["model_version"]
        again = c.post("/generate", json={"prompt": "A", "max_tokens": 8, "seed": 1}).json()
        assert again["text"] == r.json()["text"]  # the same seed, the same continuation
        for body in ({"prompt": ""}, {"prompt": "A", "max_tokens": 0}, {"prompt": "x" * 5000}, {"text": "A"}):
            assert c.post("/generate", json=body).status_code == 422, body
        assert c.post("/predict", json={"text": "A"}).status_code == 409
        assert c.get("/version").json()["family"] == "causal_lm"


def test_the_numeric_pin_makes_a_language_model_independent_of_the_cpu(lm_project, lm_reference):
    """tests/integration/test_numerics.py's proof for the language model: the same run on this CPU and on one
    without AVX-512 (as MKL and ATen see it) differs unpinned and is bitwise equal pinned."""
    spec_path, _ = lm_reference
    params = lm_project / "params.yaml"
    original = params.read_text()
    digests = {}
    try:
        for level in ("native", "x86-64-v3"):
            pinned = dict(yaml.safe_load(original), numerics={"cpu_level": level})
            params.write_text(yaml.safe_dump(pinned, sort_keys=False))
            for name, machine in (("this", {}), ("older_cpu", OLDER_CPU)):
                work = spec_path.parent / f"numerics-{level}-{name}"
                cmd = [
                    "stage",
                    "train",
                    "gpt",
                    "--spec",
                    str(spec_path),
                    "--work-dir",
                    str(work),
                    "--skip-plan",
                ]
                proc = subprocess.run(
                    [sys.executable, "-m", "reprogate", *cmd],
                    cwd=lm_project, env=as_another_machine(machine), capture_output=True, text=True,
                )  # fmt: skip
                assert proc.returncode == 0, proc.stderr[-3000:]
                files = [
                    work / "model" / "model.safetensors",
                    *sorted((work / "checkpoints").rglob("optimizer*")),
                ]
                assert len(files) > 1
                digests[level, name] = {
                    str(f.relative_to(work)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files
                }
    finally:
        params.write_text(original)
    unpinned_a, unpinned_b = digests["native", "this"], digests["native", "older_cpu"]
    assert unpinned_a["model/model.safetensors"] != unpinned_b["model/model.safetensors"]
    assert digests["x86-64-v3", "this"] == digests["x86-64-v3", "older_cpu"]
