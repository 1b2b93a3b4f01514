"""Two candidates of one revision paired on the same held-out items, as `reprogate report` pairs
a base and a head: the benches that compare candidates (bench/encoders.py, bench/screened.py)
read their predictions files through here, so they pair and refuse alike."""

from __future__ import annotations

from pathlib import Path

from reprogate.report.build import pair_predictions
from reprogate.utils.jsonl import read_jsonl

ROOT = Path(__file__).resolve().parents[1]


def labelled(name: str, split: str) -> dict[str, tuple[str, str, str]]:
    """id -> (text, gold, predicted) of predictions/<name>/<split>.jsonl."""
    rows = read_jsonl(ROOT / "predictions" / name / f"{split}.jsonl")
    return {r["id"]: (r["text"], r["gold"], r["predicted"]) for r in rows}


def paired(base: str, head: str, split: str, bench: str) -> dict:
    """Accuracy of both on the items both predicted, the head's gain with its paired-bootstrap 95%
    interval and McNemar's exact p, and how many items it fixed and broke. Two candidates that
    predicted other items, or the same ids with other texts or gold labels, are refused."""
    pb, ph = labelled(base, split), labelled(head, split)
    ids = sorted(set(pb) & set(ph))
    if not ids or any(pb[i][:2] != ph[i][:2] for i in ids):
        raise SystemExit(f"{bench}: {base} and {head} did not predict the same {split} items")
    p = pair_predictions(pb, ph, ids)
    return {
        "items": len(ids),
        "base": sum(pb[i][1] == pb[i][2] for i in ids) / len(ids),
        "head": sum(ph[i][1] == ph[i][2] for i in ids) / len(ids),
        "point": (p["fixed"] - p["broken"]) / len(ids),
        "delta_ci95": p["delta_ci95"]["accuracy"],
        "mcnemar_p": p["p_value"],
        "fixed": p["fixed"],
        "broken": p["broken"],
    }
