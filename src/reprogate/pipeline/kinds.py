"""The pipeline kinds, one object each: what differs between a classifier's pipeline and a
language model's is declared here once (in the manner of torchtitan's ModelSpec), and the
stages, the gate, promotion and the registry read it instead of asking `kind == "lm"`.

A kind is chosen by the data spec (specs.Pipeline.kind): labelled rows make a classifier, a text
corpus a language model. A third kind is one more object here, its stages under stages/.
"""

from __future__ import annotations

from dataclasses import dataclass

from reprogate.pipeline import rules
from reprogate.pipeline.rules import (
    GateRule,
    ProductionRule,
    accuracy_against_production,
    bits_against_production,
)
from reprogate.records.base import Record
from reprogate.records.evaluation import Evaluation
from reprogate.records.lm import LmEvaluation


@dataclass(frozen=True)
class Ranking:
    """How the gate orders the candidates that pass: one metric on one split, and its direction.
    `field` names it in results/gate.json and models/production.json."""

    split: str
    metric: str
    field: str
    higher_is_better: bool
    words: str  # "the <words> among passing candidates"

    def key(self, candidate: dict) -> float:
        value = candidate[self.field]
        return -value if self.higher_is_better else value


@dataclass(frozen=True)
class Kind:
    name: str
    stages: tuple[str, ...]  # in the order DVC runs them (stages/<name>.py each)
    evaluation: type[Record]  # results/<m>/eval.json
    rules: tuple[GateRule, ...]  # the gate's table, in the order results/gate.json lists them
    against_production: ProductionRule  # the one rule whose evidence differs by kind
    ranking: Ranking
    # A candidate's row of `dvc metrics show` (metrics/candidates/<m>.json): rule -> short column.
    columns: tuple[tuple[str, str], ...] = ()
    # Its candidates answer with text they write (POST /generate), not with a label (POST /predict).
    generates: bool = False
    # What predict and serve load a model of this kind with: "module:function(root, model_dir,
    # device)" (named, not imported: serving code is above this module).
    serves: str = "reprogate.predict.production:load_servable"
    # What promote writes as models/production.json: "module:function(root, name, cand, config)".
    production_record: str = "reprogate.promote.promotion:classifier_record"

    def judge(
        self, ev: dict | None, resume: dict | None, gate, prod: dict | None, export: dict | None = None
    ) -> list[dict]:
        """Every verdict on one candidate (results/<m>/eval.json, resume.json and, of an export,
        metrics/<m>/export.json as dicts)."""
        verdicts = rules.judge(self.rules, self.against_production, ev, resume, gate, prod)
        if export is not None:
            verdicts.insert(len(verdicts) - 1, rules.export_rule(export, gate))
        return verdicts


def _acted_on(challenge_set: dict) -> str:
    kinds = ", ".join(f"{k} {c['acted']}/{c['n']}" for k, c in challenge_set["by_kind"].items())
    return f" (acted on: {kinds})"


CLASSIFIER = Kind(
    name="classify",
    stages=(
        "code",
        "prepare",
        "augment",
        "features",
        "train",
        "combine",
        "export",
        "calibrate",
        "evaluate",
        "resume_check",
        "gate",
    ),  # fmt: skip
    evaluation=Evaluation,
    rules=(
        GateRule("heldout_accuracy", "accuracy", ">=", "heldout_accuracy_min", split="test"),
        GateRule(
            "ece", "ece_after", "<=", "ece_max", split="test", note="after calibration, 15 equal-width bins"
        ),
        GateRule("wrong_action_rate", "wrong_action_rate", "<=", "wrong_action_rate_max", split="test"),
        GateRule(
            "coverage", "coverage", ">=", "coverage_min", split="test", note="in-scope test queries acted on"
        ),
        GateRule(
            "real_utterance_accuracy",
            "accuracy",
            ">=",
            "real_utterance_accuracy_min",
            worst_of="real_utterance",
            absent_note="the data spec declares no real-utterance set to evaluate",
        ),
        GateRule(
            "false_positive_action_rate",
            "false_positive_action_rate",
            "<=",
            "false_positive_action_rate_max",
            worst_of="out_of_scope",
            # A classifier never shown an out-of-scope query has not earned production.
            absent="fail",
            absent_note="the data spec declares no out-of-scope evaluation set",
        ),
        GateRule(
            "challenge_action_rate",
            "action_rate",
            "<=",
            "challenge_action_rate_max",
            worst_of="challenge",
            absent_note="the data spec declares no challenge set to evaluate",
            detail=_acted_on,
        ),
    ),
    against_production=accuracy_against_production,
    ranking=Ranking("test", "accuracy", "heldout_accuracy", True, "best held-out accuracy"),
    columns=(
        ("heldout_accuracy", "accuracy"),
        ("ece", "ece"),
        ("coverage", "coverage"),
        ("wrong_action_rate", "wrong_actions"),
        ("false_positive_action_rate", "oos_fp"),
        ("real_utterance_accuracy", "real"),
        ("challenge_action_rate", "challenge"),
    ),
)

LANGUAGE_MODEL = Kind(
    name="lm",
    stages=("code", "corpus", "tokenize", "train", "lm_evaluate", "resume_check", "gate"),
    evaluation=LmEvaluation,
    rules=(
        GateRule(
            "val_bits_per_char",
            "bits_per_char",
            "<=",
            "val_bits_per_char_max",
            split="validation",
            note="the whole validation split",
        ),
    ),
    against_production=bits_against_production,
    ranking=Ranking(
        "validation", "bits_per_char", "val_bits_per_char", False, "fewest validation bits per character"
    ),
    columns=(("val_bits_per_char", "bits_per_char"),),
    generates=True,
    serves="reprogate.predict.lm:load_generator",
    production_record="reprogate.promote.promotion:lm_record",
)

KINDS = {k.name: k for k in (CLASSIFIER, LANGUAGE_MODEL)}
