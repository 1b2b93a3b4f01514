"""Per-intent error table on an evaluation set, from the committed pipeline's prediction files.

    python bench/real_errors.py [--set real_dev] [--models ngram minilm_frozen ensemble minilm_pairs]

One Markdown row per query some model got wrong: its gold intent, its text, and what each model
answered (`ok`, or the intent it predicted, with `review` when it would not have acted); then each
model's accuracy with a 95% bootstrap interval, each model's paired difference from the first
(same queries, 95% bootstrap interval of the difference), and the intents every model missed. Reads
predictions/<m>/<set>.jsonl only (run `make repro` first); real_dev is the part of the authored
real utterances that model choices may look at, so this never reads real_test.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def load(model: str, split: str) -> dict[str, dict]:
    path = ROOT / "predictions" / model / f"{split}.jsonl"
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


def interval(right: np.ndarray, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    boots = [right[rng.integers(0, len(right), len(right))].mean() for _ in range(2000)]
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return float(lo), float(hi)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", default="real_dev")
    ap.add_argument("--models", nargs="+", default=["ngram", "minilm_frozen", "ensemble", "minilm_pairs"])
    args = ap.parse_args()
    preds = {m: load(m, args.set) for m in args.models}
    ids = list(next(iter(preds.values())))
    print(f"| gold intent | query | {' | '.join(args.models)} |")
    print("|---|---|" + "---|" * len(args.models))
    missed_by_all = []
    for i in sorted(ids, key=lambda i: preds[args.models[0]][i]["gold"]):
        rows = [preds[m][i] for m in args.models]
        wrong = [r["predicted"] != r["gold"] for r in rows]
        if not any(wrong):
            continue
        if all(wrong):
            missed_by_all.append(rows[0]["gold"])
        cells = [
            ("ok" if not w else f"`{r['predicted']}`") + ("" if r["route"] == "act" else " (review)")
            for r, w in zip(rows, wrong, strict=True)
        ]
        print(f"| `{rows[0]['gold']}` | {rows[0]['text']} | {' | '.join(cells)} |")
    print()
    right = {m: np.array([p[i]["predicted"] == p[i]["gold"] for i in ids], float) for m, p in preds.items()}
    for m in args.models:
        lo, hi = interval(right[m])
        acted = [preds[m][i] for i in ids if preds[m][i]["route"] == "act"]
        wrong_acts = sum(r["predicted"] != r["gold"] for r in acted)
        print(
            f"{m}: accuracy {right[m].mean():.3f} [95% {lo:.3f}, {hi:.3f}] on {len(ids)}; "
            f"acted on {len(acted)}, {wrong_acts} of them wrong"
        )
    for m in args.models[1:]:
        d = right[m] - right[args.models[0]]
        lo, hi = interval(d)
        fixed, broken = int((d > 0).sum()), int((d < 0).sum())
        said = f"{d.mean():+.3f} [95% {lo:+.3f}, {hi:+.3f}] ({fixed} fixed, {broken} broken)"
        print(f"{m} - {args.models[0]}: {said}")
    print(f"missed by every model ({len(missed_by_all)}): {', '.join(missed_by_all)}")


if __name__ == "__main__":
    main()
