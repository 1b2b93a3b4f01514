"""What people actually say, measured: evaluate counts each challenge kind's acceptance from its
own prediction lines, and the gate judges the number evaluate wrote (on the shared built
pipeline; the sets themselves: tests/unit/test_authored_sets.py)."""

from __future__ import annotations

import csv
import io
import json

import yaml

from reprogate.predict import calibrate, evaluate, requests
from reprogate.train import job
from reprogate.train import run as training
from reprogate.utils.jsonl import read_jsonl
from tests.conftest import make_home_project


def test_evaluate_counts_challenge_acceptance_per_kind_from_its_predictions(home_pipeline):
    ev = json.loads((home_pipeline / "results/tiny/eval.json").read_text())
    lines = read_jsonl(home_pipeline / "predictions/tiny/challenge.jsonl")
    assert [x["kind"] for x in lines] == [
        r["kind"]
        for r in csv.DictReader(
            io.StringIO((home_pipeline / "tests/fixtures/home/challenge.csv").read_text())
        )
    ]
    assert all(x["gold"] is None for x in lines)
    c = ev["sets"]["challenge"]
    for kind, counts in c["by_kind"].items():
        acted = sum(x["route"] == "act" for x in lines if x["kind"] == kind)
        assert counts == {
            "n": sum(x["kind"] == kind for x in lines),
            "acted": acted,
            "action_rate": acted / counts["n"],
        }
    assert c["acted"] == sum(x["route"] == "act" for x in lines) and c["n"] == len(lines)
    # Lines of sets that are not challenge sets carry no kind.
    assert "kind" not in read_jsonl(home_pipeline / "predictions/tiny/real.jsonl")[0]
    real = ev["sets"]["real"]
    right = [x for x in read_jsonl(home_pipeline / "predictions/tiny/real.jsonl")]
    assert real["wrong_actions"] == sum(x["route"] == "act" and x["gold"] != x["predicted"] for x in right)
    g = json.loads((home_pipeline / "results/gate.json").read_text())
    rule = {r["rule"]: r for r in g["candidates"]["tiny"]["rules"]}["challenge_action_rate"]
    assert rule["value"] == c["action_rate"] and rule["threshold"] == 1.0


def test_a_budget_too_small_for_the_calibration_rows_leaves_its_rule_off_and_says_so(home_pipeline):
    # 1% budgets (the spec default) on the toy's 16 calibration queries: even a level above all of
    # them would flag about 1 new query in 17, so calibrate fits none and names the fix.
    cal = json.loads((home_pipeline / "models/tiny/calibration.json").read_text())
    fitted = cal["on_calibration_data"]["request_rules"]
    n = cal["fitted_on"]["calibration_rows"]
    assert n < requests.rows_needed(0.01) == 99
    assert fitted["off_too_few_rows"] == {"two_requests": 0.01, "ambiguous": 0.01, "too_short": 0.01}
    assert all(cal["policy"][k] is None for k in fitted["off_too_few_rows"])
    said = [w for w in cal["warnings"] if "rule is off" in w]
    assert len(said) == 3 and all(f"{n} calibration queries" in w and "at least 99" in w for w in said)
    assert all("split.calibration in specs/data/home.yaml" in w for w in said)
    known = {"low_confidence", "small_margin", "out_of_scope"}
    for f in (home_pipeline / "predictions/tiny").glob("*.jsonl"):
        for x in read_jsonl(f):
            assert (x["route"] == "act") == (x["reasons"] == []) and set(x["reasons"]) <= known


def test_request_rules_are_fitted_within_their_budgets_and_every_route_says_why(tmp_path):
    root = make_home_project(tmp_path / "home")
    budgets = {"two_requests_max": 0.1, "ambiguous_max": 0.1, "too_short_max": 0.1}
    (root / "specs/gate.yaml").write_text(yaml.safe_dump({"kind": "gate", "policy_fit": budgets}))
    job.train(
        root, training.Paths.for_model(root, "tiny"), training.Setup, skip_plan=True, log=lambda s: None
    )
    cal = calibrate.calibrate(root, "tiny", root / "specs/gate.yaml")
    fitted = cal["on_calibration_data"]["request_rules"]
    assert cal["fitted_on"]["calibration_rows"] >= requests.rows_needed(0.1) == 9
    assert "off_too_few_rows" not in fitted and not any("rule is off" in w for w in cal["warnings"])
    assert set(fitted["sent_to_review"]) == {"two_requests", "ambiguous", "too_short"}
    assert all(share <= 0.1 for share in fitted["sent_to_review"].values())
    assert cal["policy"]["two_requests"] is not None and cal["policy"]["ambiguous"] is not None
    evaluate.evaluate(root, "tiny")
    known = {"low_confidence", "small_margin", "out_of_scope", "two_requests", "ambiguous", "too_short"}
    for f in (root / "predictions/tiny").glob("*.jsonl"):
        for x in read_jsonl(f):
            assert (x["route"] == "act") == (x["reasons"] == []) and set(x["reasons"]) <= known
