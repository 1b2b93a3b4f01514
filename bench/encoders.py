"""`make bench-encoders`: all-MiniLM-L6-v2 against all-mpnet-base-v2, from what the pipelines built.

Each mpnet candidate is paired with the MiniLM candidate of the same recipe (frozen head, the
ensemble, the ensemble with the neighbour vote, the int8 export) and with the default gate's
choice: on the same held-out items (BANKING77 test, the project's real_test utterances), the
difference in accuracy with its paired-bootstrap 95% interval and McNemar's exact p. Encoding
time is features@<member>'s wall time on this machine (logs/), when this machine ran it.
Reads results/, predictions/ and logs/; trains nothing. Writes bench/results/encoders.json and
prints the tables for docs/results.md. Needs `make repro` and `make repro-experiments` first.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pairing  # bench/, this script's folder

ROOT = Path(__file__).resolve().parents[1]
PAIRS = {  # mpnet candidate -> the MiniLM candidate of the same recipe
    "mpnet_frozen": "minilm_frozen",
    "ensemble_mpnet": "ensemble",
    "ensemble_mpnet_knn": "ensemble_knn",
    "ensemble_mpnet_int8": "ensemble_int8",
}
SETS = ("test", "real_test")
# What mpnet is also compared with when the default gate (results/gate.json) chooses none:
# production's recipe.
CHOSEN = "ensemble"


def paired(base: str, head: str, split: str) -> dict:
    """The report's pairing (`reprogate report`), here between two candidates of one revision."""
    p = pairing.paired(base, head, split, "bench-encoders")
    return {k: p[k] for k in ("items", "base", "head", "delta_ci95", "mcnemar_p")}


def encoding_s(member: str) -> float | None:
    log = ROOT / "logs" / f"features@{member}.jsonl"
    if not log.is_file():
        return None
    return json.loads(log.read_text().splitlines()[-1])["telemetry"]["wall_s"]


def headline(name: str) -> dict:
    sets = json.loads((ROOT / "results" / name / "eval.json").read_text())["sets"]
    return {s: round(sets[s]["accuracy"], 4) for s in ("test", "validation", "real_dev", "real_test")} | {
        "wrong_action_rate": round(sets["test"]["wrong_action_rate"], 4),
        "coverage": round(sets["test"]["coverage"], 4),
    }


def row(r: dict) -> str:
    lo, hi = r["delta_ci95"]
    return f"{r['head'] - r['base']:+.4f} [{lo:+.4f}, {hi:+.4f}], p={r['mcnemar_p']:.3g}"


def main() -> None:
    missing = [m for m in (*PAIRS, *PAIRS.values()) if not (ROOT / "results" / m / "eval.json").is_file()]
    if missing:
        sys.exit(f"bench-encoders: no results for {', '.join(missing)}; run `make repro-experiments` first")
    gate = json.loads((ROOT / "results" / "gate.json").read_text())
    chosen = gate.get("chosen") or CHOSEN
    out: dict = {"chosen": chosen, "candidates": {}, "paired": {}}
    for m in (*PAIRS.values(), *PAIRS):
        out["candidates"][m] = headline(m)
    out["encoding_s"] = {m: encoding_s(m) for m in ("minilm_frozen", "mpnet_frozen")}
    for head, base in PAIRS.items():
        for against in dict.fromkeys((base, chosen)):
            out["paired"][f"{head} vs {against}"] = {s: paired(against, head, s) for s in SETS}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    out["commit"] = commit.stdout.strip()
    (ROOT / "bench/results").mkdir(exist_ok=True)
    (ROOT / "bench/results/encoders.json").write_text(json.dumps(out, indent=2) + "\n")
    print("| candidate | test | validation | real_dev | real_test | coverage | wrong-action |")
    print("|---|---|---|---|---|---|---|")
    for m, h in out["candidates"].items():
        print(f"| {m} | {h['test']} | {h['validation']} | {h['real_dev']} | {h['real_test']} | "
              f"{h['coverage']} | {h['wrong_action_rate']} |")  # fmt: skip
    print("\n| mpnet candidate vs | Δ test accuracy [paired 95%], McNemar p | Δ real_test accuracy |")
    print("|---|---|---|")
    for k, r in out["paired"].items():
        print(f"| {k} | {row(r['test'])} | {row(r['real_test'])} |")
    print(f"\nencoding (features@, this machine): {out['encoding_s']}")
    print(f"bench-encoders: wrote bench/results/encoders.json (commit {out['commit']})")


if __name__ == "__main__":
    main()
