"""CUDA: the CPU contracts, on a real GPU.

Skipped on machines without CUDA (CI has none); run on a GPU machine with
`python -m pytest tests/integration/test_cuda.py`. The encoder cases use a 2-layer BERT built from the
fixture's words, so that they need no model download and no model package on the GPU host.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from reprogate.records import runlog
from reprogate.train import checkpoint
from tests.conftest import TINY_NGRAM, make_home_project, run_cli, write_model_spec, write_tiny_bert

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

TINY_BERT = "encoders/tiny_bert"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = make_home_project(tmp_path_factory.mktemp("home_cuda"))
    write_tiny_bert(root, root / TINY_BERT)
    return root


def _encoder(mode: str, encoder: dict | None = None, **over) -> dict:
    spec = {
        "kind": "model",
        "data": "specs/data/home.yaml",
        "family": "encoder",
        "encoder": {"model": TINY_BERT, "mode": mode, "max_length": 16, **(encoder or {})},
        "head": {"dropout": 0.1},
        "device": "cuda",
        "threads": 2,
        "seed": 1,
        "micro_batch": 8,
        "grad_accum": 2,
        "steps": 12,
        "optimizer": {"lr": 1e-3},
        "checkpoint": {"every_steps": 3, "keep": 2},
        "resume_check": {"steps": 8, "checkpoint_every": 2, "kill_after": 5},
    }
    spec.update(over)
    return spec


RESUME_CASES = {
    "ngram_fp32": dict(TINY_NGRAM, device="cuda"),
    "ngram_bf16": dict(TINY_NGRAM, device="cuda", precision="bf16"),
    "bert_full": _encoder("full"),
    "bert_full_fp16": _encoder("full", precision="fp16"),
    "bert_lora": _encoder("lora"),
}


@pytest.mark.parametrize("name", list(RESUME_CASES))
def test_resume_check_is_bitwise_on_cuda(project, name):
    # The stage kills a real training process on the GPU and resumes it; on CUDA, with
    # deterministic kernels, the tolerance is zero, as on CPU.
    write_model_spec(project, name, RESUME_CASES[name])
    proc = run_cli("stage", "resume_check", name, cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((project / "results" / name / "resume.json").read_text())
    assert result["passed"] and result["device"] == "cuda" and result["tolerance"] == 0.0
    assert result["child_returncode"] == -9 and result["restored_step"] == 4 and result["final_step"] == 8
    assert all(f["max_abs_diff"] == 0.0 for f in result["fields"].values()), result["fields"]
    # The full run's checkpoint holds the GPU's own generator (dropout draws from it).
    run_cli("stage", "train", name, cwd=project, check=True)
    last = checkpoint.read(checkpoint.candidates(project / "runs" / name / "checkpoints")[0])
    assert last.meta["trainer"]["global_step"] == RESUME_CASES[name]["steps"]
    assert "rank0.cuda0" in last.tensors["rng"]
    assert last.fingerprint["environment"]["device"].startswith("cuda")
    if RESUME_CASES[name].get("precision") == "fp16":
        assert last.meta["scaler"]["scale"] > 0  # a live gradient scaler, saved and restored


@pytest.mark.parametrize(
    "spec",
    [dict(TINY_NGRAM, device="auto"), _encoder("full", device="auto")],
    ids=["ngram", "bert_full"],
)
def test_a_model_trained_on_cuda_scores_the_same_on_a_cpu_only_host(project, spec):
    # Train, calibrate and evaluate on the GPU; then evaluate again where CUDA is hidden,
    # as on a CPU-only serving host: same predictions, same routes.
    name = f"port_{spec['family']}"
    write_model_spec(project, name, spec)
    for stage in ("train", "calibrate", "evaluate"):
        run_cli("stage", stage, name, cwd=project, check=True)
    log, _ = runlog.read(project / "logs" / f"train@{name}.jsonl")
    assert log[-1].telemetry["device"].startswith("cuda")
    on_gpu = _predictions(project / "predictions" / name)
    run_cli("stage", "evaluate", name, cwd=project, env={"CUDA_VISIBLE_DEVICES": ""}, check=True)
    on_cpu = _predictions(project / "predictions" / name)
    assert on_gpu.keys() == on_cpu.keys() and on_gpu
    for key, (pred, route, prob) in on_gpu.items():
        cpu_pred, cpu_route, cpu_prob = on_cpu[key]
        assert (pred, route) == (cpu_pred, cpu_route), key
        assert abs(prob - cpu_prob) < 1e-4, key
    out = run_cli(
        "predict",
        "--model",
        f"models/{name}",
        "turn on the lights",
        cwd=project,
        env={"CUDA_VISIBLE_DEVICES": ""},
        check=True,
    )
    assert json.loads(out.stdout.splitlines()[0])["intent"]


def _predictions(folder: Path) -> dict[tuple[str, str], tuple[str, str, float]]:
    out = {}
    for f in sorted(folder.glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            p = json.loads(line)
            out[(f.stem, p["id"])] = (p["predicted"], p["route"], p["probability"])
    return out


def test_frozen_features_on_cuda_match_the_cpu_ones(project):
    from safetensors.torch import load_file

    from reprogate.data import features

    write_model_spec(project, "frozen_gpu", _encoder("frozen", {"layers": 2, "normalize": True}))
    write_model_spec(
        project, "frozen_cpu", _encoder("frozen", {"layers": 2, "normalize": True}, device="cpu")
    )
    features.featurize(project, "frozen_gpu")
    features.featurize(project, "frozen_cpu")
    gpu_dir, cpu_dir = project / "data/features/frozen_gpu", project / "data/features/frozen_cpu"
    files = sorted(p.name for p in gpu_dir.glob("*.safetensors"))
    assert files and files == sorted(p.name for p in cpu_dir.glob("*.safetensors"))
    for f in files:
        a, b = load_file(gpu_dir / f), load_file(cpu_dir / f)
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].device.type == "cpu" and torch.allclose(a[k], b[k], atol=1e-5), (f, k)
