"""The run registry at the issue's size: 100 runs with 3,000 paired predictions each.

    make bench-registry      # or: python bench/registry_bench.py [--runs 100] [--items 3000]

Writes a project of RUNS evaluated models in a temporary folder, each file through the record
model its stage writes it with (fingerprint, config, train record, train.tsv with 500 steps,
eval.json, a 3,000-line prediction file, a 500-update raw log), predictions drawn from a
seeded generator so every pair of runs differs on some items. Then, each as the user types it
(`reprogate registry ...`, a new process, imports included): the first sync, a second sync (a
no-op: no table version may change), `compare` of two runs, and `check` (rows and
duplicate-key groups of every table). Table sizes on disk and file counts are reported for the
same runs arriving in ten syncs, before and after `registry optimize`. Targets (issue 19): first
sync <= 20 s, no-op <= 5 s, compare < 1 s on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import yaml

from reprogate.records.base import write
from reprogate.records.calibration import PolicyRecord
from reprogate.records.evaluation import Evaluation, LabelledSet, PredictionLine
from reprogate.records.runlog import UpdateLine
from reprogate.records.train import Fingerprint, ModelConfig, TrainRecord, train_key
from reprogate.utils import jsonl

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LABELS = [f"intent_{i:02d}" for i in range(77)]
STEPS = 500


def _model(root: Path, name: str, i: int, items: int, rng: np.random.Generator) -> None:
    fp = Fingerprint(spec_hash=f"{i:064x}", data_hash="d" * 64, code_hash="c" * 64, total_steps=STEPS)
    folder = root / "models" / name
    write(folder / "fingerprint.json", fp)
    write(folder / "config.json", ModelConfig(family="ngram", n_out=77, featurizer={}, spec={"seed": i}))
    record = TrainRecord(
        steps=STEPS, epochs=3, examples=10_000, final_loss=0.1, validation_accuracy=0.9, truncated_texts=0
    )
    write(root / "metrics" / name / "train.json", record)
    losses = np.sort(rng.random(STEPS))[::-1]
    (root / "plots" / name).mkdir(parents=True)
    curve = "".join(f"{s + 1}\t{v:.6f}\t0.001\n" for s, v in enumerate(losses))
    (root / "plots" / name / "train.tsv").write_text("step\tloss\tlr\n" + curve)
    now = datetime.now(UTC)
    updates = root / "runs" / name / "updates" / f"{train_key(fp)}.jsonl"
    updates.parent.mkdir(parents=True)
    logged = [
        UpdateLine(attempt=now, step=s + 1, loss=float(v), lr=1e-3, at=now) for s, v in enumerate(losses)
    ]
    updates.write_text("".join(jsonl.line(u.model_dump(mode="json")) for u in logged))
    gold = rng.integers(0, 77, items)
    right = rng.random(items) < 0.85 + 0.1 * rng.random()
    predicted = np.where(right, gold, (gold + 1 + rng.integers(0, 76, items)) % 77)
    version = f"{name}@{i:012x}"
    lines = []
    for k in range(items):
        p, said = round(float(rng.random()), 6), LABELS[predicted[k]]
        line = PredictionLine(
            id=f"test.csv:{k}",
            text=f"query number {k} about {LABELS[gold[k]]}",
            gold=LABELS[gold[k]],
            predicted=said,
            probability=p,
            alternatives=[{"intent": said, "probability": p}],
            route="act" if p > 0.5 else "review",
            reasons=[] if p > 0.5 else ["low_confidence"],
            model_version=version,
        )
        lines.append(jsonl.line(line.model_dump(mode="json")))
    (root / "predictions" / name).mkdir(parents=True)
    (root / "predictions" / name / "test.jsonl").write_text("".join(lines))
    acc = float(right.mean())
    test = LabelledSet(kind="labelled", accuracy=acc, n=items, accuracy_ci95=[acc - 0.01, acc + 0.01])
    policy = PolicyRecord(threshold=0.5, margin=0.0)
    evaluation = Evaluation(model_version=version, temperature=1.0, policy=policy, sets={"test": test})
    write(root / "results" / name / "eval.json", evaluation)


def _project(root: Path, runs: int, items: int) -> list[str]:
    names = [f"m{i:03d}" for i in range(runs)]
    params = {"data": "specs/data/x.yaml", "models": names, "gate": "specs/gate.yaml", "registry": "registry"}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    rng = np.random.default_rng(0)
    for i, name in enumerate(names):
        _model(root, name, i, items, rng)
    return names


def _timed(root: Path, *args: str) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([str(BIN / "reprogate"), *args], cwd=root, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"reprogate {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
    return took, proc.stdout


def _sizes(registry: Path) -> dict[str, dict[str, int]]:
    """Per table: the files its current version reads (and their bytes), and all Parquet bytes
    on disk (files older versions read stay until VACUUM's retention has passed)."""
    from deltalake import DeltaTable

    out = {}
    for table in sorted(p for p in registry.iterdir() if p.is_dir()):
        live = [Path(f.removeprefix("file://")) for f in DeltaTable(str(table)).file_uris()]
        out[table.name] = {
            "live_files": len(live),
            "live_bytes": sum(f.stat().st_size for f in live),
            "disk_bytes": sum(f.stat().st_size for f in table.rglob("*.parquet")),
        }
    return out


def _incremental(root: Path, names: list[str], batches: int = 10) -> tuple[dict, dict]:
    """The same runs arriving in `batches` syncs (a registry's life: one per pull request),
    so every table gains a file per sync; its size before and after `registry optimize`."""
    params = yaml.safe_load((root / "params.yaml").read_text())
    step = len(names) // batches
    for i in range(1, batches + 1):
        models = names[: i * step] if i < batches else names
        (root / "params.yaml").write_text(yaml.safe_dump(dict(params, models=models, registry="incremental")))
        _timed(root, "registry", "sync")
    before = _sizes(root / "incremental")
    _timed(root, "registry", "optimize")
    return before, _sizes(root / "incremental")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--items", type=int, default=3000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        names = _project(root, args.runs, args.items)
        print(f"wrote {args.runs} runs x {args.items} predictions in {time.perf_counter() - t0:.1f} s")
        first, said = _timed(root, "registry", "sync")
        print(said.strip())
        versions = json.loads(_timed(root, "registry", "check", "--json")[1])
        second, said = _timed(root, "registry", "sync")
        print(said.strip())
        check = json.loads(_timed(root, "registry", "check", "--json")[1])
        assert [r["version"] for r in check] == [r["version"] for r in versions], "the no-op sync committed"
        keys = json.loads(
            _timed(root, "registry", "sql", "SELECT run_key FROM runs ORDER BY run_key", "--json")[1]
        )
        compare, said = _timed(root, "registry", "compare", keys[0]["run_key"][:12], keys[1]["run_key"][:12])
        print(said.strip())
        before, after = _incremental(root, names)
    result = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),  # fmt: skip
        "cpus": os.cpu_count(),
        "runs": len(names),
        "items_per_run": args.items,
        "first_sync_s": round(first, 2),
        "noop_sync_s": round(second, 2),
        "compare_s": round(compare, 2),
        "tables": {
            r["table"]: {"rows": r["rows"], "duplicate_key_groups": r["duplicate_key_groups"]} for r in check
        },
        "disk_after_10_syncs": before,
        "disk_after_optimize": after,
    }
    print(json.dumps(result, indent=2))
    out = ROOT / "bench" / "results" / "registry.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"registry bench: first sync {first:.1f} s (target 20), no-op {second:.1f} s (target 5), "
        f"compare {compare:.2f} s (target 1); written to {out.relative_to(ROOT)}"
    )


if __name__ == "__main__":
    main()
