"""The pipeline kinds and the gate's rule table: every row names a threshold the gate spec has
and a metric the kind's evaluation record writes on the sets it reads, every stage a kind lists
is a stage module, and the table is read the same way for every kind."""

from __future__ import annotations

import typing

import pytest

from reprogate.pipeline import runner
from reprogate.pipeline.kinds import KINDS
from reprogate.pipeline.rules import GateRule, apply
from reprogate.specs.gate import GateSpec, Thresholds

ROWS = [(k, r) for k in KINDS.values() for r in k.rules]


def _set_models(kind) -> list[type]:
    """The pydantic models of the evaluation record's sets (a union of them for a classifier)."""
    annotation = kind.evaluation.model_fields["sets"].annotation
    value = typing.get_args(annotation)[1]
    union = typing.get_args(value)[0] if typing.get_origin(value) is typing.Annotated else value
    return list(typing.get_args(union)) or [union]


@pytest.mark.parametrize(("kind", "rule"), ROWS, ids=[f"{k.name}:{r.name}" for k, r in ROWS])
def test_every_rule_reads_a_threshold_the_gate_spec_has_and_a_metric_the_evaluation_writes(kind, rule):
    assert rule.threshold in Thresholds.model_fields
    assert (rule.split is None) != (rule.worst_of is None), (
        "a rule reads one split or the worst set of a kind"
    )
    writers = [m for m in _set_models(kind) if rule.metric in m.model_fields]
    assert writers, f"no set of {kind.evaluation.__name__} has {rule.metric}"
    if rule.worst_of:
        kinds = {a for m in writers for a in typing.get_args(m.model_fields["kind"].annotation)}
        assert rule.worst_of in kinds


def test_every_kind_lists_stages_that_exist_in_the_order_they_run():
    for kind in KINDS.values():
        for name in kind.stages:
            assert runner.module(name).__name__ == f"reprogate.pipeline.stages.{name}"
        assert kind.stages[-1] == "gate" and "resume_check" in kind.stages


def test_the_worst_set_decides_a_rule_and_is_named():
    floor = GateRule("real", "accuracy", ">=", "real_utterance_accuracy_min", worst_of="real_utterance")
    sets = {
        "a": {"kind": "real_utterance", "accuracy": 0.9},
        "b": {"kind": "real_utterance", "accuracy": 0.7},
        "dev": {"kind": "real_utterance", "use": "calibrate", "accuracy": 0.1},  # never judged
    }
    t = GateSpec(kind="gate", thresholds={"real_utterance_accuracy_min": 0.8}).thresholds
    assert apply(floor, sets, t) == {
        "rule": "real",
        "value": 0.7,
        "op": ">=",
        "threshold": 0.8,
        "verdict": "fail",
        "note": "lowest of ['a', 'b']: b",
    }
    absent = GateRule(
        "fp", "false_positive_action_rate", "<=", "ece_max", worst_of="out_of_scope", absent="fail"
    )
    assert apply(absent, sets, t)["verdict"] == "fail"


def test_a_language_model_is_ranked_by_fewest_bits_and_a_classifier_by_accuracy():
    lm, clf = KINDS["lm"].ranking, KINDS["classify"].ranking
    assert sorted([{"val_bits_per_char": 2.1}, {"val_bits_per_char": 1.9}], key=lm.key)[0] == {
        "val_bits_per_char": 1.9
    }
    assert sorted([{"heldout_accuracy": 0.8}, {"heldout_accuracy": 0.9}], key=clf.key)[0] == {
        "heldout_accuracy": 0.9
    }


def test_a_production_model_without_bits_per_character_is_not_comparable_and_says_so():
    # A classifier in production, a language model as candidate: a refusal, never a crash.
    rules = KINDS["lm"].judge(
        {"sets": {"validation": {"kind": "validation", "bits_per_char": 2.0}}},
        {"passed": True},
        GateSpec(kind="gate"),
        {"model": "ensemble", "model_version": "ensemble@1", "heldout_accuracy": 0.9},
    )
    rule = {r["rule"]: r for r in rules}["not_worse_than_production"]
    assert rule["verdict"] == "fail" and "not comparable" in rule["note"] and rule["threshold"] is None
