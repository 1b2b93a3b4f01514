"""End to end: `dvc repro` for real, in a temporary copy of the repository."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import BIN, copy_project, run_cli

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


@pytest.fixture(scope="module")
def project(tmp_path_factory, mirror) -> Path:
    root = copy_project(tmp_path_factory.mktemp("e2e"))
    dvc(root, "repro", mirror=mirror)
    return root


def test_repro_builds_prepared_data_and_metrics(project):
    prepared = project / "data" / "prepared"
    for split in ("train", "validation", "calibration", "test", "oos_val", "oos_test", "negatives"):
        assert (prepared / f"{split}.jsonl").stat().st_size > 0
    m = json.loads((project / "metrics" / "data.json").read_text())
    assert m["rows"]["test"] == 3080


def test_second_repro_does_nothing(project, mirror):
    out = dvc(project, "repro", mirror=mirror).stdout
    assert "Running stage" not in out
    assert "up to date" in out


def test_model_spec_edit_does_not_rerun_prepare(project, mirror):
    spec = project / "specs" / "models" / "ngram.yaml"
    data = yaml.safe_load(spec.read_text())
    spec.write_text(spec.read_text().replace(f"seed: {data['seed']}", f"seed: {data['seed'] + 1}"))
    out = dvc(project, "repro", mirror=mirror).stdout
    assert "Running stage 'prepare'" not in out


def test_data_spec_edit_reruns_prepare(project, mirror):
    spec = project / "specs" / "data" / "banking77.yaml"
    spec.write_text(spec.read_text().replace("seed: 20200101", "seed: 20200102"))
    out = dvc(project, "repro", mirror=mirror).stdout
    assert "Running stage 'prepare'" in out
    diff = dvc(project, "params", "diff", mirror=mirror).stdout
    assert "split.seed" in diff


def test_metrics_are_visible_to_dvc(project, mirror):
    shown = dvc(project, "metrics", "show", "--json", mirror=mirror).stdout
    assert "metrics/data.json" in shown


def test_compile_check_catches_a_stale_dvc_yaml(project):
    run_cli("compile", "--check", cwd=project, check=True)
    dvc_yaml = project / "dvc.yaml"
    dvc_yaml.write_text(dvc_yaml.read_text().replace("reprogate stage prepare", "reprogate stage prepare "))
    proc = run_cli("compile", "--check", cwd=project)
    assert proc.returncode == 2 and "is stale" in proc.stderr
    run_cli("compile", cwd=project, check=True)
    run_cli("compile", "--check", cwd=project, check=True)
