"""`make bench-screened`: the candidates issue 53 added, against today's best, per gate rule.

For each new candidate and each baseline: the sets choices may look at (validation, real_dev,
challenge_dev) and the sets the gate judges (test, real_test, challenge_test, oos_test), each
gate rule's number and verdict from the experiments' gate, and, paired on the same items, the
difference with its paired-bootstrap 95% interval and McNemar's exact p: accuracy on test and
real_test, and the share of challenge_test queries *not* acted on (the gate's challenge rule).
Reads results/, predictions/ and metrics/; trains nothing. Writes bench/results/screened.json and
prints the tables for docs/results.md. Needs the candidates built (`make repro-experiments`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from pairing import paired  # bench/, this script's folder

from reprogate.utils import stats
from reprogate.utils.jsonl import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
# Each new candidate -> what it is paired with: the same recipe without the lever (the composed
# texts, the augmented memory, the fixed activation ranges), and the strongest related one.
PAIRS = {
    "minilm_screened": ("minilm_frozen",),
    "minilm_two_in_one": ("minilm_frozen", "minilm_screened"),
    "mpnet_screened": ("mpnet_frozen", "ensemble_mpnet_knn"),
    # the same texts as an output of their own (family flagged): against the recipe without them
    # and against the texts as out of scope
    "minilm_flagged": ("minilm_frozen", "minilm_screened"),
    "mpnet_flagged": ("mpnet_frozen", "mpnet_screened"),
    # the neighbour vote whose memory also holds the augmented train variants
    "ensemble_knn_aug": ("ensemble_knn",),
    "ensemble_mpnet_knn_aug": ("ensemble_mpnet_knn", "mpnet_frozen"),
    # activations quantized with fixed ranges: against the per-call int8 graph and the source
    "ensemble_int8_static": ("ensemble_int8", "ensemble"),
    "ensemble_mpnet_int8_static": ("ensemble_mpnet_int8", "ensemble_mpnet"),
}
DEV = ("validation", "real_dev", "challenge_dev")


def predictions(name: str, split: str) -> list[dict]:
    return read_jsonl(ROOT / "predictions" / name / f"{split}.jsonl")


def not_acted(name: str, split: str) -> dict[str, bool]:
    return {r["id"]: r["route"] == "review" for r in predictions(name, split)}


def paired_accuracy(base: str, head: str, split: str) -> dict:
    p = paired(base, head, split, "bench-screened")
    return {
        "point": p["point"],
        "delta": p["delta_ci95"],
        "p": p["mcnemar_p"],
        "fixed": p["fixed"],
        "broken": p["broken"],
    }


def paired_review(base: str, head: str, split: str) -> dict:
    """Head minus base in the share of queries sent to review (the challenge rule's complement)."""
    b, h = not_acted(base, split), not_acted(head, split)
    ids = sorted(set(b) & set(h))
    yb, yh = (np.array([d[i] for i in ids]) for d in (b, h))
    gold = np.ones(len(ids), dtype=bool)
    return {
        "point": float(yh.mean() - yb.mean()),
        "delta": stats.paired_bootstrap(gold, yb, yh, 2)["accuracy"],
        "p": stats.mcnemar(yb, yh)["p_value"],
        "head_acted": int((~yh).sum()),
        "base_acted": int((~yb).sum()),
    }


def headline(name: str) -> dict:
    sets = json.loads((ROOT / "results" / name / "eval.json").read_text())["sets"]
    # A default-pipeline baseline (ensemble) is judged by the default gate, the rest by their own.
    gates = [ROOT / "results" / "experiments" / "gate.json", ROOT / "results" / "gate.json"]
    judged = next((c[name] for g in gates if name in (c := json.loads(g.read_text())["candidates"])), None)
    gate = {r["rule"]: r["verdict"] for r in judged["rules"]} | {"passed": judged["passed"]} if judged else {}
    dev_acted = sum(r["route"] == "act" for r in predictions(name, "challenge_dev"))
    return {
        "validation": sets["validation"]["accuracy"],
        "real_dev": sets["real_dev"]["accuracy"],
        "challenge_dev_acted": f"{dev_acted}/{len(predictions(name, 'challenge_dev'))}",
        "test": sets["test"]["accuracy"],
        "real_test": sets["real_test"]["accuracy"],
        "challenge_test": sets["challenge_test"]["action_rate"],
        "challenge_by_kind": {k: v["acted"] for k, v in sets["challenge_test"]["by_kind"].items()},
        "wrong_action_rate": sets["test"]["wrong_action_rate"],
        "oos_fp": sets["oos_test"]["false_positive_action_rate"],
        "coverage": sets["test"]["coverage"],
        "gate": gate,
        **export_agreement(name),
    }


def export_agreement(name: str) -> dict:
    """An export's agreement with its source on test (the gate's export rule), else nothing."""
    record = ROOT / "metrics" / name / "export.json"
    if not record.is_file():
        return {}
    test = json.loads(record.read_text())["agreement"]["test"]
    return {"export_agreement": test["share"], "export_differ": test["n"] - test["agree"]}


def interval(r: dict) -> str:
    lo, hi = r["delta"]
    return f"{r['point']:+.3f} [{lo:+.3f}, {hi:+.3f}], p={r['p']:.2g}"


def main() -> None:
    # results/ is in git, predictions/ is a DVC output: a candidate is built here when both are.
    read = ("test", "real_test", "challenge_test", *DEV)

    def built(m: str) -> bool:
        files = [ROOT / "results" / m / "eval.json"] + [ROOT / "predictions" / m / f"{s}.jsonl" for s in read]
        return all(f.is_file() for f in files)

    pairs = {h: bases for h, bases in PAIRS.items() if built(h) and all(map(built, bases))}
    if not pairs:
        sys.exit(
            "bench-screened: no new candidate is built with its baselines; run `make repro-experiments` first"
        )
    for h in PAIRS.keys() - pairs.keys():
        print(f"bench-screened: {h} or its baselines {', '.join(PAIRS[h])} are not built here; left out")
    names = list(dict.fromkeys(m for h, bases in pairs.items() for m in (h, *bases)))
    out: dict = {
        "candidates": {m: headline(m) for m in names},
        "paired": {},
        "not_built": sorted(PAIRS.keys() - pairs.keys()),
    }
    for head, bases in pairs.items():
        for base in bases:
            out["paired"][f"{head} vs {base}"] = {
                "test": paired_accuracy(base, head, "test"),
                "real_test": paired_accuracy(base, head, "real_test"),
                "challenge_test_review": paired_review(base, head, "challenge_test"),
            }
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    out["commit"] = commit.stdout.strip()
    (ROOT / "bench/results").mkdir(exist_ok=True)
    (ROOT / "bench/results/screened.json").write_text(json.dumps(out, indent=2) + "\n")
    print("| candidate | validation | real_dev | challenge_dev acted | test | real_test (≥ 0.95) | challenge "
          "acted (≤ 0.05; by kind) | wrong actions (≤ 0.02) | oos FP (≤ 0.01) | coverage |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m, h in out["candidates"].items():
        kinds = ", ".join(f"{k} {v}" for k, v in h["challenge_by_kind"].items())
        print(f"| {m} | {h['validation']:.4f} | {h['real_dev']:.3f} | {h['challenge_dev_acted']} | "
              f"{h['test']:.4f} | {h['real_test']:.3f} | {h['challenge_test']:.3f} ({kinds}) | "
              f"{h['wrong_action_rate']:.4f} | {h['oos_fp']:.4f} | {h['coverage']:.3f} |")  # fmt: skip
    print("\n| paired (head vs base) | Δ test accuracy | Δ real_test accuracy | Δ challenge_test to review |")
    print("|---|---|---|---|")
    for k, r in out["paired"].items():
        print(f"| {k} | {interval(r['test'])} | {interval(r['real_test'])} | "
              f"{interval(r['challenge_test_review'])} |")  # fmt: skip
    for m, h in out["candidates"].items():
        failed = [r for r, v in h["gate"].items() if v == "fail"]
        if not h["gate"]:
            print(f"{m}: not judged yet by the experiments' gate (dvc repro experiments/dvc.yaml:gate)")
        else:
            print(f"{m}: gate {'passed' if h['gate']['passed'] else 'fails ' + ', '.join(failed)}")
    for m, h in out["candidates"].items():
        if "export_agreement" in h:
            share, differ = h["export_agreement"], h["export_differ"]
            print(f"{m}: agrees with its source on test {share:.4f} ({differ} differ)")
    print(f"bench-screened: wrote bench/results/screened.json (commit {out['commit']})")


if __name__ == "__main__":
    main()
