"""The GPU fine-tune as shipped (specs/models/mpnet_pairs.yaml: same-intent sentence pairs plus a
head, trained and resume-checked on CUDA, exported to float32 and int8 ONNX that a CPU serves and
the gate judges), run through its stages on a 2-layer BERT: on CUDA where a GPU is, on the CPU
here. The recipe is read from the spec file itself; only its size and encoder are made small."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import REPO, make_home_project, run_cli, write_model_spec, write_tiny_bert

# Minutes of one worker (the recipe trained, resume-checked and exported twice): the long tier,
# which CI runs after `make test` (docs/testing.md). The cheaper forms stay in the first tier:
# test_train's kill-point property, test_export's float32 and int8 exports.
pytestmark = pytest.mark.long

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TINY_BERT = "encoders/tiny_bert"
CPU_HOST = {"CUDA_VISIBLE_DEVICES": ""}  # what a home server without a GPU sees


def _shipped(name: str, **over) -> dict:
    spec = yaml.safe_load((REPO / "specs" / "models" / f"{name}.yaml").read_text())
    return dict(spec, data="specs/data/home.yaml", **over)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = make_home_project(tmp_path_factory.mktemp("gpu_recipe"))
    write_tiny_bert(root, root / TINY_BERT)
    spec = _shipped(
        "mpnet_pairs",
        device=DEVICE,
        augment=False,  # the home data has no augment step
        micro_batch=8,
        steps=12,
        checkpoint={"every_steps": 3, "keep": 2},
        resume_check={"steps": 8, "checkpoint_every": 2, "kill_after": 5},
    )
    assert spec["encoder"]["contrastive"] and spec["optimizer"]["head_lr"]  # the recipe under test
    spec["encoder"].update(model=TINY_BERT, max_length=16)
    spec["head"] = {"dropout": 0.0}  # the home data has no out-of-scope negatives to learn from
    spec.pop("budget")
    write_model_spec(root, "pairs", spec)
    for name in ("mpnet_pairs_onnx", "mpnet_pairs_int8"):
        export = _shipped(name)
        export["export"]["source"] = "pairs"
        write_model_spec(root, name.replace("mpnet_", ""), export)
    return root


def test_the_fine_tune_resumes_bitwise_where_it_trains(project):
    run_cli("stage", "resume_check", "pairs", cwd=project, check=True)
    result = json.loads((project / "results/pairs/resume.json").read_text())
    assert result["passed"] and result["tolerance"] == 0.0 and result["device"].startswith(DEVICE)
    assert result["child_returncode"] == -9 and result["final_step"] == 8
    assert all(f["max_abs_diff"] == 0.0 for f in result["fields"].values()), result["fields"]


def test_its_exports_are_what_a_cpu_serves_and_the_gate_judges(project):
    for stage in ("train", "calibrate"):
        run_cli("stage", stage, "pairs", cwd=project, check=True)
    for name in ("pairs_onnx", "pairs_int8"):
        run_cli("stage", "export", name, cwd=project, env=CPU_HOST, check=True)
        assert (project / f"models/{name}/model.onnx").is_file()
        record = json.loads((project / f"metrics/{name}/export.json").read_text())
        assert record["source"] == "pairs" and record["agreement"]["test"]["share"] >= 0.9
    for stage in ("calibrate", "evaluate"):  # the int8 graph, judged as the CPU serves it
        run_cli("stage", stage, "pairs_int8", cwd=project, env=CPU_HOST, check=True)
    judged = json.loads((project / "results/pairs_int8/eval.json").read_text())
    assert judged["model_version"].startswith("pairs_int8@") and judged["sets"]["test"]["n"] > 0
    float32 = json.loads((project / "metrics/pairs_onnx/export.json").read_text())
    assert float32["agreement"]["test"]["share"] == 1.0  # the same network, another runtime
    out = run_cli("predict", "--model", "models/pairs_int8", "turn on the lights", cwd=project, env=CPU_HOST)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[0])["intent"]
