"""`reprogate report --base REV [--head REV] --out DIR`: the pull-request report.

Compares two revisions from their own files (revision.py): the gate's verdicts and every
rule, the headline metrics with direction-aware deltas, paired tests on the same held-out items
(bootstrap interval of the difference, McNemar), the intents that moved most, the stages that
reran (from dvc.lock), the resume checks and the environment. DIR/report.json holds every
number; DIR/report.md and its PNG plots (report_plots.py) are rendered from it, so nothing in
the report is typed by hand.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from reprogate.records.evaluation import EvalMetrics
from reprogate.records.revision import Revision, stage_changes
from reprogate.utils import stats
from reprogate.utils.errors import UserError

HIGHER_IS_BETTER = {"accuracy": True, "macro_f1": True, "coverage": True}
LOWER = ("ece", "nll", "wrong_action_rate", "false_positive_action_rate", "action_rate")
HIGHER_IS_BETTER |= dict.fromkeys(LOWER, False)
# A language model's headline numbers, per scored split (train, validation): all losses.
LM_METRICS = ("bits_per_char", "nats_per_char", "bits_per_byte", "perplexity")
HELDOUT = "test"
TOP_INTENTS = 10


def _models(base: Revision, head: Revision) -> list[str]:
    names = list(head.gate.candidates if head.gate else [])
    return names + [m for m in (base.gate.candidates if base.gate else []) if m not in names]


def _gate(base: Revision, head: Revision) -> dict[str, Any]:
    sides = {"base": base.gate, "head": head.gate}
    out: dict[str, Any] = {
        side: {"passed": d.passed, "chosen": d.chosen, "reasons": d.reasons} if d else None
        for side, d in sides.items()
    }
    rows = {}
    for side, d in sides.items():
        for name, cand in (d.candidates if d else {}).items():
            for r in cand.rules:
                row = rows.setdefault((name, r.rule), {"candidate": name, "rule": r.rule})
                row[side] = {"value": r.value, "op": r.op, "threshold": r.threshold, "verdict": r.verdict}
    changed = lambda row: (row.get("base") or {}).get("verdict") != (row.get("head") or {}).get("verdict")  # noqa: E731
    out["rules"] = sorted(rows.values(), key=lambda row: not changed(row))  # stable: changed first
    for row in out["rules"]:
        row["changed"] = changed(row)
    return out


def _row(model: str, split: str, metric: str, vb: Any, vh: Any, higher: bool) -> dict[str, Any]:
    delta = vh - vb if vb is not None and vh is not None else None
    better = None if not delta else (delta > 0) == higher
    return {"model": model, "set": split, "metric": metric, "base": vb, "head": vh} | {
        "delta": delta,
        "better": better,
    }


def _lm_metrics(base: Revision, head: Revision, name: str) -> list[dict[str, Any]]:
    b, h = base.lm_evaluation(name), head.lm_evaluation(name)
    sb, sh = (b.sets if b else {}), (h.sets if h else {})
    return [
        _row(
            name,
            split,
            metric,
            getattr(sb.get(split), metric, None),
            getattr(sh.get(split), metric, None),
            False,
        )
        for split in [*sh, *(s for s in sb if s not in sh)]
        for metric in LM_METRICS
    ]


def _metrics(base: Revision, head: Revision, models: list[str]) -> list[dict[str, Any]]:
    rows = []
    for name in models:
        if head.is_language_model(name) or base.is_language_model(name):
            rows += _lm_metrics(base, head, name)
            continue
        b, h = base.evaluation(name), head.evaluation(name)
        hb = EvalMetrics.of(b).sets if b else {}
        hh = EvalMetrics.of(h).sets if h else {}
        for split in [*hh, *(s for s in hb if s not in hh)]:
            for metric, higher in HIGHER_IS_BETTER.items():
                vb = getattr(hb.get(split), metric, None)
                vh = getattr(hh.get(split), metric, None)
                if vb is not None or vh is not None:
                    rows.append(_row(name, split, metric, vb, vh, higher))
    return rows


def pair_predictions(pb: dict, ph: dict, common: list[str]) -> dict[str, Any]:
    """Two models' predictions of the same items (id -> (text, gold, predicted)), on `common`:
    McNemar's exact test and the paired-bootstrap 95% intervals of head minus base."""
    labels = sorted({ph[i][1] for i in common})
    index = {lbl: k for k, lbl in enumerate(labels)}  # a prediction outside gold: wrong
    gold = np.array([index[ph[i][1]] for i in common])
    yb, yh = (np.array([index.get(p[i][2], len(labels)) for i in common]) for p in (pb, ph))
    return {
        "paired": True,
        **stats.mcnemar(yb == gold, yh == gold),
        "delta_ci95": stats.paired_bootstrap(gold, yb, yh, len(labels)),
    }


def _paired(base: Revision, head: Revision, models: list[str]) -> dict[str, Any]:
    """Per model present in both: the held-out items both revisions predicted (same id, text
    and gold), McNemar's test and the paired bootstrap interval of the difference."""
    out: dict[str, Any] = {}
    for name in models:
        if head.is_language_model(name):
            out[name] = {"paired": False, "why": "a language model: its samples are not labelled predictions"}
            continue
        pb, ph = base.predictions(name, HELDOUT), head.predictions(name, HELDOUT)
        common = [i for i in ph if i in pb and pb[i][:2] == ph[i][:2]]
        sizes = {"base_items": len(pb), "head_items": len(ph)}
        if common:
            out[name] = pair_predictions(pb, ph, common) | sizes
        else:
            why = "no prediction file" if not (pb and ph) else "no item in common"
            out[name] = {"paired": False, "why": why} | sizes
    return out


def _intents(base: Revision, head: Revision, models: list[str]) -> dict[str, Any]:
    chosen = (head.gate.chosen if head.gate else None) or (models[0] if models else None)
    if chosen is None:
        return {"model": None, "moved": []}
    fb, fh = base.per_intent(chosen), head.per_intent(chosen)
    moved = [{"intent": k, "base": fb[k], "head": fh[k], "delta": fh[k] - fb[k]} for k in fh if k in fb]
    moved.sort(key=lambda r: (-abs(r["delta"]), r["intent"]))
    return {"model": chosen, "moved": [r for r in moved if r["delta"]][:TOP_INTENTS]}


def _resume(base: Revision, head: Revision, models: list[str]) -> list[dict[str, Any]]:
    rows = []
    for name in models:
        b, h = base.resume(name), head.resume(name)
        if b is None and h is None:
            continue  # an ensemble: its members' checks count
        rows.append(
            {
                "model": name,
                **{
                    side: {
                        "passed": r.passed,
                        "restored_step": r.restored_step,
                        "final_step": r.final_step,
                        "failed": sorted(k for k, f in (r.fields or {}).items() if f.verdict == "fail"),
                    }
                    if r
                    else None
                    for side, r in (("base", b), ("head", h))
                },
            }
        )
    return rows


def _environment(base: Revision, head: Revision, model: str | None) -> dict[str, Any]:
    # The repository's lock, above a project in a subfolder (lm/): the folder at or above it
    # that holds one, as `compile` finds it.
    root = base.root.resolve()
    found = next((d for d in [root, *root.parents] if (d / "requirements.lock").is_file()), root)
    lock = os.path.relpath(found / "requirements.lock", root)
    out = {}
    for side, rev in (("base", base), ("head", head)):
        fp = rev.fingerprint(model) if model else None
        if fp and fp.members:  # an ensemble was combined, not trained: a member's environment
            fp = rev.fingerprint(next(iter(fp.members)))
        out[side] = {
            "requirements_lock_sha256": rev.file_sha256(lock),
            "code_hash": fp.code_hash if fp else None,
            "environment": (fp.environment or {}) if fp else {},
        }
    return out


def build(root: Path, base_rev: str, head_rev: str | None = None, part: str = "default") -> dict[str, Any]:
    """The report of pipeline `part`'s gate: the default's four candidates, or the experiments'
    gate over every candidate of both pipelines (and both pipelines' stages)."""
    base, head = Revision(root, base_rev, part=part), Revision(root, head_rev, part=part)
    models = _models(base, head)
    intents = _intents(base, head, models)
    return {
        "base": {"label": base.label, "commit": base.commit},
        "head": {"label": head.label, "commit": head.commit},
        "pipeline": part,
        "gate": _gate(base, head),
        "metrics": _metrics(base, head, models),
        "paired": _paired(base, head, models),
        "intents": intents,
        "stages": stage_changes(base.lock, head.lock),
        "resume": _resume(base, head, models),
        "environment": _environment(base, head, intents["model"]),
        "missing": base.missing + head.missing,
    }


def reproduced(root: Path, base_commit: str, rebuilt: Path, part: str = "default") -> dict[str, Any]:
    """Did a rebuild of the base (its folder after `make repro`) give the base commit's outputs?
    `reprogate verify`'s verdicts, at its default tolerance, over every lock the report's
    pipeline has (the experiments' build on the default's)."""
    from reprogate.pipeline.verify import DEFAULT_TOLERANCE, check_rebuilt, compare

    check_rebuilt(root, rebuilt, part, "report --base-rebuilt")
    parts = ["default"] + ([part] if part != "default" else [])
    verdicts = [v for p in parts for v in compare(root, base_commit, rebuilt, DEFAULT_TOLERANCE, p)]
    return {
        "rebuilt": str(rebuilt),
        "tolerance": DEFAULT_TOLERANCE,
        "counts": {
            k: sum(v.verdict == k for v in verdicts)
            for k in ("bitwise", "within tolerance", "different", "missing")
        },
        "not_bitwise": [
            {"path": v.path, "verdict": v.verdict, "detail": v.detail}
            for v in verdicts
            if v.verdict != "bitwise"
        ],
    }


def refuse_unsafe_out(out: Path) -> None:
    """--out must be a folder of our own: never a file, and never a link a write would follow
    (report.md as a symlink to ~/.bashrc, say). Checked before anything is read or written."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        what = "a symbolic link" if out.is_symlink() else "a file"
        raise UserError(
            f"report: --out {out} is {what}, not a folder; give a folder (it is created if missing), "
            "e.g. --out report/. Nothing was written."
        )
    links = sorted(p.name for p in out.glob("*") if p.is_symlink()) if out.is_dir() else []
    if links:
        raise UserError(
            f"report: {out} holds symbolic links where the report writes its files ({', '.join(links)}); "
            "the report never writes through a link. Remove them or give another --out. Nothing was written."
        )


def write(
    root: Path,
    base_rev: str,
    head_rev: str | None,
    out: Path,
    base_rebuilt: Path | None = None,
    part: str = "default",
) -> str:
    from reprogate.report import plots as report_plots
    from reprogate.report.markdown import render

    refuse_unsafe_out(out)
    report = build(root, base_rev, head_rev, part)
    if base_rebuilt:
        report["reproduced"] = reproduced(root, report["base"]["commit"], base_rebuilt, part)
    else:
        report["reproduced"] = None
    theirs, missing = report_plots.dvc_plots(root, base_rev, head_rev, report["intents"]["model"])
    report["missing"] += [missing] if missing else []
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    images = report_plots.draw(report_plots.specs(report) | theirs, out)
    (out / "report.md").write_text(render(report, images), encoding="utf-8")
    g = report["gate"]
    verdict = lambda s: "no gate record" if not g[s] else (g[s]["chosen"] or "nothing passed")  # noqa: E731
    return (
        f"report: {report['head']['label']} vs {report['base']['label']}: chosen {verdict('head')} "
        f"(base: {verdict('base')}); {len(report['stages']['reran'])} stage(s) reran; "
        f"{out / 'report.md'} with {len(images)} plot(s)"
    )
