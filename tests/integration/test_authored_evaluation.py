"""What people actually say, measured: evaluate counts each challenge kind's acceptance from its
own prediction lines, and the gate judges the number evaluate wrote (on the shared built
pipeline; the sets themselves: tests/unit/test_authored_sets.py)."""

from __future__ import annotations

import csv
import io
import json

from reprogate.utils.jsonl import read_jsonl


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


def test_request_rules_are_fitted_within_their_budgets_and_every_route_says_why(home_pipeline):
    cal = json.loads((home_pipeline / "models/tiny/calibration.json").read_text())
    fitted = cal["on_calibration_data"]["request_rules"]
    assert set(fitted["sent_to_review"]) == {"two_requests", "ambiguous", "too_short"}
    # The spec's default budgets (policy_fit.*_max: 1%) bound what each rule took from calibration.
    assert all(share <= 0.01 for share in fitted["sent_to_review"].values())
    assert {"two_requests", "ambiguous", "too_short"} <= set(cal["policy"])
    known = {"low_confidence", "small_margin", "out_of_scope", "two_requests", "ambiguous", "too_short"}
    for f in (home_pipeline / "predictions/tiny").glob("*.jsonl"):
        for x in read_jsonl(f):
            assert (x["route"] == "act") == (x["reasons"] == []) and set(x["reasons"]) <= known
