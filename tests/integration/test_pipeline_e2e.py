"""End to end: `dvc repro` for real, in a temporary copy of the repository."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import BIN, copy_project, run_cli, stages_run, without_experiments, write_model_spec

pytestmark = pytest.mark.e2e


def dvc(project: Path, *args: str, mirror: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "REPROGATE_MIRROR": str(mirror),
    }
    proc = subprocess.run([str(BIN / "dvc"), *args], cwd=project, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"dvc {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


# A small but real model spec, so the whole pipeline runs in CI in about a minute.
SMALL = {
    "kind": "model",
    "description": "CI-sized ngram model",
    "data": "specs/data/banking77.yaml",
    "family": "ngram",
    "ngram": {"buckets": 16384, "dim": 32},
    "device": "cpu",
    "seed": 5,
    "micro_batch": 128,
    "epochs": 2,
    "optimizer": {"lr": 0.02, "weight_decay": 0.0},
    "checkpoint": {"every_steps": 50, "keep": 2},
    "budget": {"max_minutes": 5, "max_memory_gb": 4},
}


@pytest.fixture(scope="module")
def project(tmp_path_factory, mirror) -> Path:
    root = copy_project(tmp_path_factory.mktemp("e2e"))
    write_model_spec(root, "small", SMALL)
    params = yaml.safe_load((root / "params.yaml").read_text())
    (root / "params.yaml").write_text(yaml.safe_dump(dict(params, models=["small"]), sort_keys=False))
    without_experiments(root)
    (root / "dvc.lock").unlink()  # the repository's stages are not this project's (conftest)
    run_cli("compile", cwd=root, check=True)
    dvc(root, "repro", mirror=mirror)
    return root


def test_repro_runs_every_stage(project):
    m = json.loads((project / "metrics" / "small" / "train.json").read_text())
    assert m["steps"] == 2 * 63 and m["validation_accuracy"] > 0.5
    assert (project / "models" / "small" / "model.safetensors").is_file()
    assert (project / "data" / "features" / "small" / "manifest.json").is_file()
    r = json.loads((project / "results" / "small" / "resume.json").read_text())
    assert r["passed"] and r["tolerance"] == 0.0


def test_repro_builds_prepared_data_and_metrics(project):
    prepared = project / "data" / "prepared"
    for split in ("train", "validation", "calibration", "test", "oos_val", "oos_test", "negatives"):
        assert (prepared / f"{split}.jsonl").stat().st_size > 0
    m = json.loads((project / "metrics" / "data.json").read_text())
    assert m["rows"]["test"] == 3080


def test_second_repro_does_nothing(project, mirror):
    out = dvc(project, "repro", mirror=mirror).stdout
    assert stages_run(out) == []
    # Stage code ran, found every stage's code as before, and so every other stage was skipped.
    assert "every stage's code as before" in out and "Stage 'gate' didn't change, skipping" in out


def test_head_change_retrains_without_refeaturizing(project, mirror):
    write_model_spec(project, "small", dict(SMALL, seed=6, optimizer={"lr": 0.03}))
    out = dvc(project, "repro", mirror=mirror).stdout
    assert "Running stage 'train@small'" in out
    assert "Running stage 'prepare'" not in out and "Running stage 'features@small'" not in out


# Which stages a change reruns is DVC's decision from the declared dependencies: a dry run shows
# that decision without spending a minute acting on it (the head change above does run).
def test_featurizer_change_refeaturizes(project, mirror):
    write_model_spec(project, "small", dict(SMALL, ngram={"buckets": 8192, "dim": 32}))
    out = dvc(project, "repro", "--dry", mirror=mirror).stdout
    assert "Running stage 'features@small'" in out and "Running stage 'prepare'" not in out


def test_data_spec_edit_reruns_prepare(project, mirror):
    spec = project / "specs" / "data" / "banking77.yaml"
    spec.write_text(spec.read_text().replace("seed: 20200101", "seed: 20200102"))
    out = dvc(project, "repro", "--dry", mirror=mirror).stdout
    assert "Running stage 'prepare'" in out
    diff = dvc(project, "params", "diff", mirror=mirror).stdout
    assert "split.seed" in diff


def test_dvc_metrics_show_is_one_row_per_candidate_and_the_rest_on_request(project, mirror):
    shown = json.loads(dvc(project, "metrics", "show", "--json", mirror=mirror).stdout)[""]["data"]
    assert set(shown) == {"metrics/gate.json", "metrics/candidates/small.json"}
    row = shown["metrics/candidates/small.json"]["data"]
    columns = {"accuracy", "ece", "coverage", "wrong_actions", "oos_fp", "real", "challenge", "passed"}
    assert set(row) == columns
    table = dvc(project, "metrics", "show", mirror=mirror).stdout.splitlines()
    assert len(table) == 3 and max(map(len, table)) <= 160  # a terminal's width
    asked = dvc(project, "metrics", "show", "metrics/data.json", mirror=mirror).stdout
    assert "rows.train" in asked


def test_compile_check_catches_a_stale_dvc_yaml(project):
    run_cli("compile", "--check", cwd=project, check=True)
    dvc_yaml = project / "dvc.yaml"
    dvc_yaml.write_text(dvc_yaml.read_text().replace("reprogate stage prepare", "reprogate stage prepare "))
    proc = run_cli("compile", "--check", cwd=project)
    assert proc.returncode == 2 and "is stale" in proc.stderr
    run_cli("compile", cwd=project, check=True)
    run_cli("compile", "--check", cwd=project, check=True)
