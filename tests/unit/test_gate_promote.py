"""Calibration, gate and promotion: the model earns production, or production stays put."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reprogate.folder.files import model_version
from reprogate.pipeline.kinds import CLASSIFIER
from reprogate.pipeline.stages import gate
from reprogate.predict import calibrate
from reprogate.predict.calibration import (
    TEMPERATURE_RANGE,
    Policy,
    act_mask,
    certifiable,
    ece,
    fit_policy,
    fit_temperature,
    prediction,
    probabilities,
    rows_to_certify,
    upper_bound,
)
from reprogate.specs.gate import GateSpec
from reprogate.train import run as training
from reprogate.utils.errors import UserError
from tests.conftest import make_home_project, run_cli


def test_temperature_recovers_a_known_miscalibration():
    # Labels drawn from the true probabilities with a seeded generator (the global torch RNG
    # made this flaky): the true logits are calibrated, the same logits times 3 are not.
    rng = np.random.default_rng(0)
    true = torch.from_numpy(rng.normal(0, 2, (20000, 10)))
    probs = torch.softmax(true, -1).numpy()
    gold = torch.from_numpy((rng.random((len(probs), 1)) > probs.cumsum(1)).sum(1).clip(max=9))
    assert abs(fit_temperature(true * 3.0, gold) - 3.0) < 0.15
    assert ece(probabilities(true), gold.numpy())[0] < 0.02
    assert ece(probabilities(true * 3.0), gold.numpy())[0] > 0.1


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    wrong_max=st.sampled_from([0.0, 0.02, 0.1]),
    fp_max=st.sampled_from([0.0, 0.01, 0.05]),
)
def test_routing_policy_never_breaks_its_limits_on_the_data_it_was_fitted_on(seed, wrong_max, fp_max):
    rng = np.random.default_rng(seed)
    cal = rng.dirichlet(np.ones(6) * 0.3, 200)
    gold = rng.integers(0, 6, 200)
    oos = rng.dirichlet(np.ones(6) * 0.3, 50)
    p = fit_policy(cal, gold, oos, None, wrong_max, fp_max)
    pred, conf = cal.argmax(1), cal.max(1)
    top2 = np.sort(cal, 1)
    act = (conf >= p["threshold"]) & (top2[:, -1] - top2[:, -2] >= p["margin"])
    if act.any():
        assert ((pred != gold) & act).sum() / act.sum() <= wrong_max + 1e-12
    o2 = np.sort(oos, 1)
    assert ((oos.max(1) >= p["threshold"]) & (o2[:, -1] - o2[:, -2] >= p["margin"])).mean() <= fp_max + 1e-12


@given(
    weights=st.lists(st.integers(0, 6), min_size=3, max_size=6),
    threshold=st.floats(0.0, 1.0),
    margin=st.floats(0.0, 1.0),
    oos=st.booleans(),
)
def test_served_route_is_the_route_that_was_evaluated(weights, threshold, margin, oos):
    # Coverage and wrong-action in eval.json are computed with act_mask; a query served with
    # the same probabilities must get the same route, ties included (small integers make them).
    row = np.array(weights, dtype=np.float64) + 1e-3
    row /= row.sum()
    labels = [f"l{i}" for i in range(len(row))]
    oos_index = len(row) - 1 if oos else None
    policy = Policy(1.0, threshold, margin)
    p = prediction(row, labels, policy, oos_index)
    assert (p["route"] == "act") == bool(act_mask(row[None], policy, oos_index)[0])
    assert p["intent"] == labels[int(row.argmax())] and p["alternatives"][0]["intent"] == p["intent"]
    assert (p["route"] == "review") == bool(p["reasons"])


def test_upper_bound_matches_clopper_pearson():
    # Zero errors in n: the bound has the closed form 1 - (1 - confidence) ** (1 / n).
    assert upper_bound(0, 100, 0.9) == pytest.approx(1 - 0.1 ** (1 / 100))
    assert upper_bound(7, 500, 0.0) == 7 / 500
    # Above the seen rate, and closer to it with more data at the same rate.
    assert 7 / 500 < upper_bound(70, 5000, 0.9) < upper_bound(7, 500, 0.9)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), confidence=st.sampled_from([0.5, 0.8, 0.9, 0.95]))
def test_bounded_policy_is_certified_and_never_covers_more_than_the_point_policy(seed, confidence):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, (800, 8))
    cal = torch.softmax(torch.from_numpy(logits), -1).numpy()
    gold = np.where(rng.random(800) < 0.9, cal.argmax(1), rng.integers(0, 8, 800))
    oos = rng.dirichlet(np.ones(8) * 0.2, 20)  # too few to show 2% at any of these confidences
    point = fit_policy(cal, gold, oos, None, 0.02, 0.02)
    bounded = fit_policy(cal, gold, oos, None, 0.02, 0.02, confidence)
    assert bounded["coverage"] <= point["coverage"]
    assert bounded["bound_confidence"] == {"wrong_action_rate": confidence, "false_positive_action_rate": 0.0}
    if bounded["coverage"] > 0:
        act = act_mask(cal, Policy(1.0, bounded["threshold"], bounded["margin"]), None)
        wrong = int(((cal.argmax(1) != gold) & act).sum())
        assert upper_bound(wrong, int(act.sum()), confidence) <= 0.02


def test_model_version_follows_the_weights_and_an_ensembles_members(tmp_path):
    from safetensors.torch import save_file

    d = tmp_path / "ens"
    d.mkdir()
    save_file({"w": torch.ones(3)}, str(d / "model.safetensors"))
    (d / "fingerprint.json").write_text(json.dumps({"spec_hash": "same", "members": {"a": "1"}}))
    first = model_version(d)
    (d / "fingerprint.json").write_text(json.dumps({"spec_hash": "same", "members": {"a": "2"}}))
    second = model_version(d)
    save_file({"w": torch.zeros(3)}, str(d / "model.safetensors"))
    third = model_version(d)
    assert first.startswith("ens@") and len({first, second, third}) == 3


def _eval(acc: float, fp: float, wrong: float = 0.01, ece_after: float = 0.03) -> dict:
    return {
        "model_version": "x@1",
        "sets": {
            "test": {
                "kind": "labelled",
                "accuracy": acc,
                "accuracy_ci95": [acc - 0.01, acc + 0.01],
                "ece_after": ece_after,
                "wrong_action_rate": wrong,
            },
            "oos_test": {"kind": "out_of_scope", "false_positive_action_rate": fp},
        },
    }


def test_best_accuracy_can_lose_to_a_safer_model(tmp_path):
    for name, ev in {"sharp": _eval(0.95, fp=0.05), "safe": _eval(0.92, fp=0.004)}.items():
        (tmp_path / "results" / name).mkdir(parents=True)
        (tmp_path / "results" / name / "eval.json").write_text(json.dumps(ev))
        (tmp_path / "results" / name / "resume.json").write_text(json.dumps({"passed": True}))
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "gate.yaml").write_text("kind: gate\n")
    r = gate.decide(tmp_path, ["sharp", "safe"], tmp_path / "specs" / "gate.yaml")
    assert r["passed"] and r["chosen"] == "safe"
    sharp = {x["rule"]: x for x in r["candidates"]["sharp"]["rules"]}
    assert sharp["false_positive_action_rate"] == {
        "rule": "false_positive_action_rate",
        "value": 0.05,
        "op": "<=",
        "threshold": 0.01,
        "verdict": "fail",
        "note": "highest of ['oos_test']: oos_test",
    }
    assert sharp["heldout_accuracy"]["verdict"] == "pass"
    assert json.loads((tmp_path / "results" / "gate.json").read_text()) == r
    # The DVC metrics: whether one passed and which, and one row per candidate with the same few
    # columns (what the gate judged, under short names) and its verdict; the rest stays in results/.
    assert json.loads((tmp_path / "metrics" / "gate.json").read_text()) == {"passed": True, "chosen": "safe"}
    row = json.loads((tmp_path / "metrics" / "candidates" / "sharp.json").read_text())
    assert row["passed"] is False and row["oos_fp"] == 0.05
    columns = {"passed", "accuracy", "ece", "coverage", "wrong_actions", "oos_fp", "real", "challenge"}
    assert set(row) <= columns
    assert json.loads((tmp_path / "metrics" / "candidates" / "safe.json").read_text())["passed"] is True


def test_candidate_worse_than_production_beyond_its_interval_fails():
    prod = {"model": "old", "model_version": "old@1", "heldout_accuracy": 0.95}
    rules = {
        r["rule"]: r
        for r in CLASSIFIER.judge(_eval(0.93, 0.0), {"passed": True}, GateSpec(kind="gate"), prod)
    }
    assert rules["not_worse_than_production"]["verdict"] == "fail"  # 0.94 (upper end) < 0.95
    rules = {
        r["rule"]: r
        for r in CLASSIFIER.judge(_eval(0.945, 0.0), {"passed": True}, GateSpec(kind="gate"), prod)
    }
    assert rules["not_worse_than_production"]["verdict"] == "pass"  # within the interval


def test_production_measured_on_other_heldout_data_is_not_compared():
    prod = {
        "model": "old",
        "model_version": "old@1",
        "heldout_accuracy": 0.80,
        "data_sha256": {"test": "a" * 64},
    }
    ev = _eval(0.93, 0.0)
    ev["sets"]["test"]["data_sha256"] = "b" * 64
    rule = {r["rule"]: r for r in CLASSIFIER.judge(ev, {"passed": True}, GateSpec(kind="gate"), prod)}[
        "not_worse_than_production"
    ]
    # Higher accuracy, but on another test set: a failed rule that says why and what to do.
    assert rule["verdict"] == "fail"
    assert "another held-out set" in rule["note"] and "compare_to_production.enabled" in rule["note"]
    ev["sets"]["test"]["data_sha256"] = "a" * 64
    rules = {r["rule"]: r for r in CLASSIFIER.judge(ev, {"passed": True}, GateSpec(kind="gate"), prod)}
    assert rules["not_worse_than_production"]["verdict"] == "pass"


def _fit(temperature: float, rows: int, oos_rows: int, wrong_bound: float, fp_bound: float) -> dict:
    return {
        "temperature": temperature,
        "fitted_on": {"calibration_rows": rows, "out_of_scope_rows": oos_rows},
        "limits": {
            "wrong_action_rate_max": 0.02,
            "bound_confidence": {"false_positive_action_rate": fp_bound, "wrong_action_rate": wrong_bound},
        },
    }


def test_calibrate_says_when_the_false_positive_limit_is_only_an_estimate():
    def said(oos_rows: int, wrong_bound: float, fp_bound: float, confidence: float = 0.9) -> str:
        fit = _fit(1.2, 994, oos_rows, wrong_bound, fp_bound)
        return " ".join(calibrate.warnings(fit, confidence, "specs/data/b.yaml", all_right=False))

    assert "seen on 100 out-of-scope queries, too few for a confidence bound" in said(100, 0.9, 0.0)
    assert said(1000, 0.9, 0.9) == ""
    assert "false-positive limit was not fitted" in said(0, 0.9, 0.0)
    # Asked for no bound: nothing to warn about.
    assert said(100, 0.0, 0.0, confidence=0.0) == ""


@settings(deadline=None)  # the first call imports scipy
@given(limit=st.floats(0.001, 0.2), confidence=st.floats(0.5, 0.99))
def test_rows_to_certify_is_the_smallest_set_that_can_show_the_limit(limit, confidence):
    n = rows_to_certify(limit, confidence)
    assert certifiable(n, limit, confidence) and not certifiable(n - 1, limit, confidence)


def test_a_small_calibration_set_is_said_to_give_estimates_not_bounds():
    # 90 queries, all right: no temperature minimises their NLL (it falls all the way to T=0),
    # so the model's own probabilities are kept, and no bound on the wrong-action rate exists;
    # both are said, with the data spec field to change.
    rng = np.random.default_rng(0)
    gold = torch.from_numpy(rng.integers(0, 10, 90))
    noise = torch.from_numpy(rng.normal(0, 1, (90, 10)))
    logits = torch.nn.functional.one_hot(gold, 10).double() * 6 + noise
    assert calibrate.separable(logits, gold)
    assert fit_temperature(logits, gold) == 1.0
    policy = fit_policy(probabilities(logits), gold.numpy(), np.zeros((0, 10)), None, 0.02, 0.01, 0.9)
    assert policy["bound_confidence"]["wrong_action_rate"] == 0.0
    said = calibrate.warnings(_fit(1.0, 90, 0, 0.0, 0.0), 0.9, "specs/data/home.yaml", all_right=True)
    assert len(said) == 3
    assert "all 90 calibration queries right" in said[0] and "specs/data/home.yaml" in said[0]
    assert "seen on 90 calibration queries" in said[1] and "at least 114 are needed" in said[1]
    # One wrong answer and the NLL has a minimum again: a real temperature, sharper than 1 here.
    gold[0] = (gold[0] + 1) % 10
    assert not calibrate.separable(logits, gold)
    assert fit_temperature(logits, gold) < 1.0
    said = calibrate.warnings(_fit(TEMPERATURE_RANGE[0], 90, 0, 0.0, 0.0), 0.9, "d.yaml", all_right=False)
    assert "stopped at its bound 0.05" in said[0] and "overconfident" in said[0]


def test_what_a_calibration_cannot_promise_is_kept_with_it(tmp_path):
    from reprogate.train import job

    root = make_home_project(tmp_path)
    (root / "specs" / "gate.yaml").write_text("kind: gate\npolicy_fit: {confidence: 0.9}\n")
    job.train(
        root, training.Paths.for_model(root, "tiny"), training.Setup, skip_plan=True, log=lambda s: None
    )
    said = calibrate.calibrate(root, "tiny", root / "specs" / "gate.yaml")
    stored = json.loads((root / "models/tiny/calibration.json").read_text())
    # 15 oos_val queries cannot bound a 1% rate: said on the run and kept in the file, where a
    # reviewer of the model (and of its promotion) reads its calibration.
    assert any("15 out-of-scope queries, too few for a confidence bound" in w for w in said["warnings"])
    assert stored["warnings"] == said["warnings"]


def test_failed_resume_check_or_missing_metrics_fail_the_gate(tmp_path):
    rules = {r["rule"]: r["verdict"] for r in CLASSIFIER.judge(None, None, GateSpec(kind="gate"), None)}
    assert rules["heldout_accuracy"] == "fail" and rules["resume_equivalence"] == "fail"
    # A candidate listed in params.yaml whose stages never ran (dvc.yaml not recompiled) is a
    # recorded failure that says why, not a crash.
    (tmp_path / "gate.yaml").write_text("kind: gate\n")
    r = gate.decide(tmp_path, ["newcomer"], tmp_path / "gate.yaml")
    assert not r["passed"] and r["chosen"] is None and r["candidates"]["newcomer"]["not_evaluated"]
    assert "newcomer: not evaluated (no results/newcomer/eval.json" in gate.summary(r)
    assert "run `reprogate compile`, then `dvc repro`" in gate.summary(r)


def test_damaged_evidence_is_a_recorded_failure_not_a_crash(tmp_path):
    (tmp_path / "gate.yaml").write_text("kind: gate\n")
    (tmp_path / "results" / "cut").mkdir(parents=True)
    (tmp_path / "results" / "cut" / "eval.json").write_text('{"sets": {"test": ')  # a killed writer
    (tmp_path / "results" / "cut" / "resume.json").write_text("<<<<<<< HEAD\n")  # a merge conflict
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "production.json").write_text('<<<<<<< HEAD\n{"model": "a"}\n=======\n')
    r = gate.decide(tmp_path, ["cut"], tmp_path / "gate.yaml")
    assert not r["passed"] and json.loads((tmp_path / "results" / "gate.json").read_text()) == r
    assert "cut: not evaluated (results/cut/eval.json is not valid JSON" in gate.summary(r)
    assert "dvc repro --force --single-item evaluate@cut" in gate.summary(r)
    rules = {x["rule"]: x for x in r["candidates"]["cut"]["rules"]}
    assert rules["resume_equivalence"]["verdict"] == "fail"
    assert "resume.json is not valid JSON" in rules["resume_equivalence"]["note"]
    compared = rules["not_worse_than_production"]
    assert compared["verdict"] == "fail" and "production.json is not valid JSON" in compared["note"]
    assert "git checkout HEAD -- models/production.json" in compared["note"]
    # A record that is JSON but not one promote wrote (no held-out accuracy): the same, said so.
    (tmp_path / "models" / "production.json").write_text('{"model": "a", "model_version": "a@1"}')
    again = gate.decide(tmp_path, ["cut"], tmp_path / "gate.yaml")["candidates"]["cut"]["rules"]
    rules = {x["rule"]: x for x in again}
    assert "it has no heldout_accuracy" in rules["not_worse_than_production"]["note"]


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (
            lambda ev: ev["sets"]["test"].update(accuracy="0.95"),
            "sets.test.accuracy: Input should be a valid",
        ),
        (lambda ev: ev["sets"]["oos_test"].pop("kind"), "sets.oos_test: Unable to extract tag"),
        (lambda ev: ev["sets"]["test"].update(accuracy_ci95=None, accuracy=None), "sets.test.accuracy"),
        (
            lambda ev: ev["sets"]["oos_test"].pop("false_positive_action_rate"),
            "sets.oos_test.false_positive_action_rate: missing",
        ),
        (lambda ev: ev.update(sets=[]), "sets: Input should be an object"),
    ],
)
def test_evidence_with_the_wrong_fields_is_a_recorded_failure_not_a_crash(tmp_path, edit, said):
    # Valid JSON, but not what evaluate writes (a hand edit, a file from another tool): the
    # gate names the field and fails the candidate; it never raises a KeyError or TypeError.
    (tmp_path / "gate.yaml").write_text("kind: gate\n")
    (tmp_path / "results" / "m").mkdir(parents=True)
    ev = _eval(0.95, 0.0)
    edit(ev)
    (tmp_path / "results" / "m" / "eval.json").write_text(json.dumps(ev))
    (tmp_path / "results" / "m" / "resume.json").write_text(json.dumps({"passed": "yes"}))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "production.json").write_text(json.dumps({"model": "a", "data_sha256": "abc"}))
    r = gate.decide(tmp_path, ["m"], tmp_path / "gate.yaml")
    assert not r["passed"] and r["chosen"] is None
    assert f"m: not evaluated (results/m/eval.json does not have the fields reprogate writes ({said}" in (
        gate.summary(r)
    )
    rules = {x["rule"]: x for x in r["candidates"]["m"]["rules"]}
    assert (
        "resume.json does not have the fields reprogate writes (passed:"
        in rules["resume_equivalence"]["note"]
    )
    assert (
        "production.json does not have the fields reprogate writes (data_sha256:"
        in (rules["not_worse_than_production"]["note"])
    )


def test_schema_out_must_be_a_folder(tmp_path):
    (tmp_path / "taken").write_text("x")
    proc = run_cli("schema", "--out", str(tmp_path / "taken"), cwd=tmp_path)
    assert proc.returncode == 2 and "that is a file; give a folder" in proc.stderr
    assert (tmp_path / "taken").read_text() == "x"


# ---------------------------------------------------------------- the whole loop, for real


def test_a_model_that_acts_on_nothing_fails_the_coverage_floor():
    # Routing every query to review makes no wrong action; the coverage floor still rejects it.
    idle = _eval(0.95, fp=0.0, wrong=0.0)
    idle["sets"]["test"]["coverage"] = 0.0
    floor = GateSpec(kind="gate", thresholds={"coverage_min": 0.5})
    rules = {r["rule"]: r for r in CLASSIFIER.judge(idle, {"passed": True}, floor, None)}
    assert rules["wrong_action_rate"]["verdict"] == "pass"
    assert rules["coverage"] == {
        "rule": "coverage",
        "value": 0.0,
        "op": ">=",
        "threshold": 0.5,
        "verdict": "fail",
        "note": "in-scope test queries acted on",
    }
    idle["sets"]["test"]["coverage"] = 0.84
    assert {r["rule"]: r for r in CLASSIFIER.judge(idle, {"passed": True}, floor, None)}["coverage"][
        "verdict"
    ] == "pass"
    unset = {r["rule"]: r for r in CLASSIFIER.judge(idle, {"passed": True}, GateSpec(kind="gate"), None)}
    assert unset["coverage"]["verdict"] == "n/a" and "coverage_min" in unset["coverage"]["note"]


def test_ensemble_weights_are_fitted_only_where_the_calibration_data_can_weigh_the_members():
    from reprogate.predict import combine

    rng = np.random.default_rng(1)
    gold = torch.from_numpy(rng.integers(0, 5, 200))
    sharp = torch.log_softmax(
        torch.nn.functional.one_hot(gold, 5).double() * 3 + 0.5 * torch.randn(200, 5), -1
    )
    noisy = torch.log_softmax(torch.randn(200, 5, dtype=torch.float64), -1)
    # Every row right: the NLL falls forever as the weights grow. Their direction still favours
    # the member that separates the classes; their scale is set to a weighted mean.
    model, fitted = combine.fit_weights(torch.stack([sharp, noisy], 1).float(), gold, 2)
    w = model.weights().detach()
    assert not fitted and abs(float(w.sum()) - 1.0) < 1e-6 and w[0] > w[1]
    # Some rows wrong: a real minimum, and the informative member weighs more.
    gold[:30] = (gold[:30] + 1) % 5
    model, fitted = combine.fit_weights(torch.stack([sharp, noisy], 1).float(), gold, 2)
    w = model.weights().detach()
    assert fitted and w[0] > w[1]


def test_a_model_spec_edited_into_an_invalid_one_is_a_recorded_failure(tmp_path):
    # An ensemble's spec read for its members' resume evidence, broken after its stages ran: the
    # gate still writes its decision, fails that candidate with the spec's own error, and judges
    # the others.
    (tmp_path / "gate.yaml").write_text("kind: gate\n")
    (tmp_path / "specs" / "models").mkdir(parents=True)
    (tmp_path / "specs" / "models" / "broken.yaml").write_text("kind: model\nfamily: ensemble\nepochs: -1\n")
    for name in ("broken", "fine"):
        (tmp_path / "results" / name).mkdir(parents=True)
        (tmp_path / "results" / name / "eval.json").write_text(json.dumps(_eval(0.95, fp=0.0)))
    (tmp_path / "results" / "fine" / "resume.json").write_text(json.dumps({"passed": True}))
    r = gate.decide(tmp_path, ["broken", "fine"], tmp_path / "gate.yaml")
    assert r["chosen"] == "fine" and json.loads((tmp_path / "results" / "gate.json").read_text()) == r
    rule = next(x for x in r["candidates"]["broken"]["rules"] if x["rule"] == "resume_equivalence")
    assert rule["verdict"] == "fail"
    assert rule["note"].startswith("specs/models/broken.yaml no longer validates")
    assert "broken.yaml" in rule["note"].split("validates", 1)[1]


@pytest.mark.parametrize(
    ("record", "said"),
    [
        ('{"passed": true', "gate.json is not valid JSON"),
        (
            '{"passed": true, "chosen": "m"}',
            "gate.json does not have the fields reprogate writes (reasons: missing",
        ),
        (
            '{"passed": "yes", "chosen": "m", "reasons": [], "candidates": {}}',
            "(passed: Input should be a valid boolean, found 'yes'",
        ),
        ('{"passed": true, "chosen": "m", "reasons": [], "candidates": {}}', "chose 'm', which is not among"),
        (
            '{"passed": true, "chosen": "m", "reasons": [], "candidates": {"m": {"passed": true, '
            '"heldout_accuracy": 0.9, "model_version": "m@1", '
            '"rules": [{"rule": "ece", "verdict": "pass"}]}}}',
            "(candidates.m.rules.0.value: missing",
        ),
    ],
)
def test_promote_refuses_a_gate_record_the_gate_did_not_write(tmp_path, record, said):
    # A hand edit or a merge of results/gate.json: one paragraph naming the file and the fix,
    # never a KeyError, and nothing is written.
    from reprogate.promote import promotion as promote

    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "gate.json").write_text(record)
    with pytest.raises(UserError) as err:
        promote.plan(tmp_path)
    assert str(tmp_path / "results" / "gate.json") in str(err.value) and said in str(err.value)
    assert "run `dvc repro`" in str(err.value)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["gate.json", "results"]


def test_the_gate_record_is_what_promote_reads(tmp_path):
    # The shape promote checks is the one the gate writes: a real decision passes it.
    for name, ev in {"sharp": _eval(0.95, fp=0.05), "safe": _eval(0.92, fp=0.004)}.items():
        (tmp_path / "results" / name).mkdir(parents=True)
        (tmp_path / "results" / name / "eval.json").write_text(json.dumps(ev))
        (tmp_path / "results" / name / "resume.json").write_text(json.dumps({"passed": True}))
    from reprogate.promote import promotion as promote

    (tmp_path / "gate.yaml").write_text("kind: gate\n")
    r = gate.decide(tmp_path, ["sharp", "safe"], tmp_path / "gate.yaml")
    assert promote.read_decision(tmp_path, "fix") == r
