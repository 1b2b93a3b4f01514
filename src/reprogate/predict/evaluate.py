"""What stage `evaluate@m` runs: every evaluation set scored, its prediction files, metrics and
plots (pipeline/stages/evaluate.py declares it to DVC)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from reprogate.data.prepared import gold_indices, prepared_file
from reprogate.folder.files import model_version, read_calibration
from reprogate.predict.calibration import Policy, act_mask, confidence_margin, ece, prediction, probabilities
from reprogate.predict.scorers import open_scorer
from reprogate.records.base import write
from reprogate.records.evaluation import EvalMetrics, Evaluation, PredictionLine
from reprogate.specs.data import DataSpec
from reprogate.specs.loader import load_spec
from reprogate.utils import jsonl, paths
from reprogate.utils.errors import UserError
from reprogate.utils.hashing import sha256_file
from reprogate.utils.jsonl import read_jsonl
from reprogate.utils.stats import bootstrap_ci, macro_f1, per_class


def eval_sets(data: DataSpec) -> dict[str, tuple[str, str | None]]:
    """Every set evaluated, name -> (kind, use): validation, test and every declared set, those
    calibration may look at (use: calibrate) too, so their numbers are seen beside the others."""
    sets: dict[str, tuple[str, str | None]] = {"validation": ("labelled", None), "test": ("labelled", None)}
    sets.update(data.prepared_sets())
    return sets


def evaluate(root: Path, name: str) -> dict[str, Any]:
    scorer = open_scorer(root, name)
    calibration_path = scorer.dir / "calibration.json"
    if not scorer.files.has("calibration.json"):
        raise UserError(f"{calibration_path} does not exist; run `dvc repro calibrate@{name}` first.")
    calibration = read_calibration(calibration_path, scorer.files.json("calibration.json"))
    policy = Policy.of(calibration)
    data = load_spec(root / scorer.spec.data, DataSpec)
    version = model_version(scorer.files)

    pred_dir = root / paths.predictions_dir(name)
    if pred_dir.exists():
        shutil.rmtree(pred_dir)
    pred_dir.mkdir(parents=True)
    plots = root / paths.plots_dir(name)
    plots.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for split, (kind, use) in eval_sets(data).items():
        source = prepared_file(root, split)
        rows = read_jsonl(source)
        logits = scorer.split_logits(split)
        cal = probabilities(logits, policy.temperature)
        challenge = kind == "challenge"
        extra = policy.request_reasons([r["text"] for r in rows], cal, scorer)
        _write_predictions(pred_dir / f"{split}.jsonl", rows, cal, extra, scorer, policy, version, challenge)
        # The content hash lets the gate refuse to compare accuracies measured on different data.
        head = {
            "kind": kind,
            "n": len(rows),
            **({"use": use} if use else {}),
            "data_sha256": sha256_file(source),
        }
        act = act_mask(cal, policy, scorer.oos_index, extra)
        if kind == "out_of_scope":
            results[split] = {
                **head,
                "false_positive_action_rate": float(act.mean()),
                "coverage": float(act.mean()),
            }
            continue
        if challenge:
            results[split] = {**head, **_challenge(rows, act)}
            continue
        raw = probabilities(logits)
        gold = gold_indices(rows, scorer.labels)
        results[split], per_intent, bins = _labelled(
            head, gold, raw, cal, act, scorer.labels, len(data.labels), scorer.oos_index
        )
        if split == "test":
            _plots(plots, scorer.labels, gold, cal.argmax(1), cal, *bins)
            (plots / "per_intent.json").write_text(json.dumps(per_intent, ensure_ascii=False) + "\n")
    metrics = Evaluation(
        heldout="test",
        device=scorer.device.type,
        model_version=version,
        temperature=policy.temperature,
        policy=calibration.policy,
        sets=results,
    )
    write(root / paths.results_dir(name) / "eval.json", metrics)
    write(root / paths.metrics_dir(name) / "eval.json", EvalMetrics.of(metrics))
    return metrics.model_dump(mode="json", exclude_unset=True)


def _challenge(rows: list[dict], act: np.ndarray) -> dict[str, Any]:
    """Share of a challenge set acted on, overall and per kind (the row's source label)."""
    by_kind: dict[str, list[bool]] = {}
    for r, a in zip(rows, act, strict=True):
        by_kind.setdefault(r["source_label"], []).append(bool(a))
    return {
        "action_rate": float(act.mean()),
        "acted": int(act.sum()),
        "by_kind": {
            k: {"n": len(v), "acted": sum(v), "action_rate": sum(v) / len(v)}
            for k, v in sorted(by_kind.items())
        },
    }


def _write_predictions(
    path: Path,
    rows: list[dict],
    cal: np.ndarray,
    extra: list[list[str]],
    scorer,
    policy,
    version,
    challenge: bool,
) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r, p, more in zip(rows, cal, extra, strict=True):
            said = prediction(p, scorer.labels, policy, scorer.oos_index, more)
            # docs/design.md's name in prediction files is `predicted`, beside `gold`; a Prediction
            # object from predict or serve calls the same answer `intent`.
            line = PredictionLine(
                id=r["id"],
                text=r["text"],
                gold=r["label"],
                predicted=said.pop("intent"),
                **said,
                model_version=version,
                **({"kind": r["source_label"]} if challenge else {}),
            )
            f.write(jsonl.line(line.model_dump(mode="json", exclude_unset=True)))


def _labelled(head: dict, gold: np.ndarray, raw, cal, act, labels: list[str], n_labels: int, oos: int | None):
    """A labelled set's metrics, its per-intent precision, recall and F1, and its reliability
    diagram before and after calibration."""
    pred = cal.argmax(1)
    correct = pred == gold
    n_act = int(act.sum())
    (ece_before, bins_before), (ece_after, bins_after) = ece(raw, gold), ece(cal, gold)
    result = {
        **head,
        "accuracy": float(correct.mean()),
        "macro_f1": macro_f1(gold, pred, n_labels),
        **bootstrap_ci(gold, pred, n_labels),
        "ece_before": ece_before,
        "ece_after": ece_after,
        "nll": float(-np.log(np.clip(cal[np.arange(len(gold)), gold], 1e-12, None)).mean()),
        "coverage": n_act / len(gold),
        "acted_accuracy": float(correct[act].mean()) if n_act else None,
        "wrong_action_rate": float((act & ~correct).sum() / n_act) if n_act else 0.0,
        "wrong_actions": int((act & ~correct).sum()),
        "predicted_out_of_scope": int((pred == oos).sum()) if oos is not None else 0,
    }
    p, r, f1, support = per_class(gold, pred, len(labels))
    per_intent = [
        {
            "intent": labels[i],
            "precision": float(p[i]),
            "recall": float(r[i]),
            "f1": float(f1[i]),
            "support": int(support[i]),
        }
        for i in range(n_labels)
    ]
    return result, per_intent, (bins_before, bins_after)


def _plots(plots: Path, labels, gold, pred, cal, bins_before, bins_after) -> None:
    confusion = [{"actual": labels[g], "predicted": labels[p]} for g, p in zip(gold, pred, strict=True)]
    (plots / "confusion.json").write_text(json.dumps(confusion, ensure_ascii=False) + "\n")
    reliability = [dict(b, calibration="before") for b in bins_before] + [
        dict(b, calibration="after") for b in bins_after
    ]
    (plots / "reliability.json").write_text(json.dumps(reliability) + "\n")
    _, conf, _ = confidence_margin(cal)
    correct = pred == gold
    curve = []
    for t in np.linspace(0, 1, 51):
        act = conf >= t
        if act.any():
            curve.append(
                {
                    "threshold": round(float(t), 3),
                    "coverage": float(act.mean()),
                    "accuracy": float(correct[act].mean()),
                }
            )
    (plots / "coverage.json").write_text(json.dumps(curve) + "\n")


def summary(name: str, m: dict[str, Any]) -> str:
    t = m["sets"]["test"]
    judged = {n: x for n, x in m["sets"].items() if x.get("use", "evaluate") == "evaluate"}
    more = []
    for n, x in judged.items():
        if x["kind"] == "out_of_scope":
            more.append(f"{n} FP-action {x['false_positive_action_rate']:.3f}")
        elif x["kind"] == "real_utterance":
            more.append(f"{n} accuracy {x['accuracy']:.3f} ({x['wrong_actions']} wrong actions)")
        elif x["kind"] == "challenge":
            more.append(f"{n} acted on {x['acted']}/{x['n']}")
    return (
        f"evaluate: {name}: test accuracy {t['accuracy']:.4f} [{t['accuracy_ci95'][0]:.4f}, "
        f"{t['accuracy_ci95'][1]:.4f}], ECE {t['ece_before']:.4f} -> {t['ece_after']:.4f}, coverage "
        f"{t['coverage']:.3f}, wrong-action {t['wrong_action_rate']:.4f}; " + ", ".join(more)
    )
