"""A model family written outside reprogate (tests/families/bow_mlp.py) runs the whole loop with
no edit to reprogate: train with checkpoints, the resume check, calibrate, evaluate, gate,
promote, predict and serve. docs/your-own-model.md is this test in prose."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import (
    BIN,
    REPO,
    TINY_NGRAM,
    copy_home,
    dvc_cmd,
    dvc_status,
    git_cmd,
    run_cli,
    stages_run,
    write_model_spec,
)

FAMILY = REPO / "tests" / "families" / "bow_mlp.py"
BOW = {
    **{k: v for k, v in TINY_NGRAM.items() if k != "ngram"},
    "family": "bow_mlp:BowMlp",
    "bow_mlp": {"buckets": 2048, "hidden": 32},
    "steps": 80,
    "optimizer": {"lr": 0.02},
    "checkpoint": {"every_steps": 20, "keep": 2},
}


@pytest.fixture(scope="module")
def own(home_pipeline, tmp_path_factory) -> tuple[Path, str]:
    """The home pipeline with one more candidate, of the user's family; `dvc repro` run and committed."""
    root = copy_home(home_pipeline, tmp_path_factory.mktemp("own") / "home")
    shutil.copy(FAMILY, root / "bow_mlp.py")
    write_model_spec(root, "bow", BOW)
    params = yaml.safe_load((root / "params.yaml").read_text())
    (root / "params.yaml").write_text(yaml.safe_dump(dict(params, models=["bow"]), sort_keys=False))
    run_cli("validate", "specs/", cwd=root, check=True)
    run_cli("compile", cwd=root, check=True)
    out = dvc_cmd(root, "repro")
    git_cmd(root, "add", "-A")
    git_cmd(root, "commit", "-qm", "bow")
    return root, out


def test_every_stage_runs_for_the_family_and_its_run_resumes_exactly(own):
    root, out = own
    ran = stages_run(out)
    for stage in ("train@bow", "resume_check@bow", "calibrate@bow", "evaluate@bow", "gate"):
        assert stage in ran, ran
    resume = json.loads((root / "metrics/bow/resume.json").read_text())
    assert resume["passed"] is True and resume["failed_fields"] == 0
    # Its code identity holds the user's module: DVC reruns its stages when it changes.
    identity = json.loads((root / "code/train/bow_mlp.json").read_text())
    assert "bow_mlp" in identity["modules"] and identity["family"] == "bow_mlp:BowMlp"


def test_a_change_to_the_family_module_reruns_its_stages_and_a_comment_nothing(own, tmp_path):
    root = copy_home(own[0], tmp_path / "home")
    # Beside a model of another family (built already: its stages are in the lock).
    params = yaml.safe_load((root / "params.yaml").read_text())
    (root / "params.yaml").write_text(yaml.safe_dump(dict(params, models=["tiny", "bow"]), sort_keys=False))
    run_cli("compile", cwd=root, check=True)
    dvc_cmd(root, "repro")
    module = root / "bow_mlp.py"
    module.write_text(module.read_text() + "\n# a comment changes nothing a stage computes\n")
    assert stages_run(dvc_cmd(root, "repro")) == []
    module.write_text(module.read_text().replace("nn.ReLU())", "nn.Tanh())"))
    run_cli("stage", "code", cwd=root, check=True)  # what `dvc repro` runs first
    stale = set(dvc_status(root))
    assert {"features@bow", "train@bow", "resume_check@bow", "calibrate@bow", "evaluate@bow"} <= stale
    assert not [s for s in stale if s.endswith("@tiny") or s == "prepare"], stale  # another family's


def test_the_family_is_gated_promoted_predicted_and_served(own):
    root, _ = own
    gate = json.loads((root / "metrics/gate.json").read_text())
    assert gate["passed"] is True and gate["chosen"] == "bow"
    done = run_cli("promote", cwd=root, check=True)
    assert "bow" in done.stdout
    version = json.loads((root / "models/production.json").read_text())["model_version"]
    assert version.startswith("bow@")
    assert git_cmd(root, "log", "-1", "--format=%s").startswith("promote bow")

    said = run_cli("predict", "turn on the kitchen lights", cwd=root, check=True)
    answer = json.loads(said.stdout.splitlines()[0])
    assert answer["model_version"] == version

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [str(BIN / "reprogate"), "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline, reply = time.monotonic() + 60, None
        while reply is None and time.monotonic() < deadline and server.poll() is None:
            try:
                reply = httpx.post(
                    f"http://127.0.0.1:{port}/predict", json={"texts": ["play some jazz"]}, timeout=10
                )
            except httpx.TransportError:
                time.sleep(0.2)
        assert reply is not None, (
            server.communicate(timeout=10)[0] if server.poll() is not None else "no answer"
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["predictions"][0]["model_version"] == version
    finally:
        server.terminate()
        server.wait(timeout=30)
