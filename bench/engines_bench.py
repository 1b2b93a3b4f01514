"""One process against 2 ranks under each engine, matched batch, on BANKING77 (not a test).

    make bench-engines     # or: python bench/engines_bench.py [--repeats 3]

The ngram spec (specs/models/ngram.yaml) three ways, the same global batch of 128:
  1 process of 2 threads (micro_batch 128);
  PyTorch elastic, 2 ranks of 1 thread (micro_batch 64 each);
  Ray Train, 2 workers of 1 thread (micro_batch 64 each).
Each is the real `reprogate stage train ngram` in a fresh folder, `repeats` times, in turn.
Per run: the command's wall time, the training loop's examples/s and seconds per update, and
validation accuracy; Ray's start-up (the command's time before rank 0 starts) separately.
Writes bench/results/engines.json; docs/benchmarks.md quotes it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "engines.json"
SETUPS = {
    "1 process x 2 threads": {},
    "elastic 2 ranks x 1 thread": {"processes": 2, "threads": 1, "micro_batch": 64},
    "ray 2 workers x 1 thread": {"processes": 2, "threads": 1, "micro_batch": 64, "executor": "ray"},
}


def run_once(spec: dict, folder: Path) -> dict:
    spec_path = folder / "ngram.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    work = folder / "work"
    cmd = [sys.executable, "-m", "reprogate", "stage", "train", "ngram", "--spec", str(spec_path)]
    cmd += ["--work-dir", str(work), "--skip-plan"]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"bench: {' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    told = json.loads((work / "run.jsonl").read_text().splitlines()[-1])["telemetry"]
    record = json.loads((work / "metrics" / "train.json").read_text())
    batch = spec["micro_batch"] * spec.get("processes", 1) * spec["grad_accum"]
    return {
        "command_wall_s": round(wall, 2),
        "train_wall_s": told["wall_s"],  # rank 0's train(): set-up, loop, export
        "examples_per_s": told["examples_per_s"],
        "ms_per_update": round(1000 * batch / told["examples_per_s"], 2),
        "validation_accuracy": record["validation_accuracy"],
        "steps": record["steps"],
        "start_up_s": round(wall - told["wall_s"], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    base = yaml.safe_load((ROOT / "specs" / "models" / "ngram.yaml").read_text())
    base["device"] = "cpu"
    runs: dict[str, list[dict]] = {name: [] for name in SETUPS}
    for _ in range(args.repeats):
        for name, change in SETUPS.items():  # interleaved, so a slow minute hits all alike
            # Inside the project (runs/ is git-ignored): a spec's paths are the project's.
            (ROOT / "runs").mkdir(exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="bench-engines-", dir=ROOT / "runs") as tmp:
                runs[name].append(run_once({**base, **change}, Path(tmp)))
            print(f"{name}: {runs[name][-1]}", flush=True)
    one = statistics.median(r["examples_per_s"] for r in runs["1 process x 2 threads"])
    summary = {}
    for name, rs in runs.items():
        eps = statistics.median(r["examples_per_s"] for r in rs)
        summary[name] = {
            "median_examples_per_s": eps,
            "throughput_vs_1_process": round(eps / one, 3),
            "median_ms_per_update": statistics.median(r["ms_per_update"] for r in rs),
            "median_command_wall_s": statistics.median(r["command_wall_s"] for r in rs),
            "median_start_up_s": statistics.median(r["start_up_s"] for r in rs),
            "validation_accuracy": sorted({r["validation_accuracy"] for r in rs}),
        }
    elastic, ray = (summary[n]["median_ms_per_update"] for n in list(SETUPS)[1:])
    result = {
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "date": time.strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
        "repeats": args.repeats,
        "summary": summary,
        "ray_per_update_vs_elastic": round(ray / elastic, 3),
        "runs": runs,
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    for name, s in summary.items():
        print(
            f"{name}: {s['median_examples_per_s']} examples/s ({s['throughput_vs_1_process']}x), "
            f"{s['median_ms_per_update']} ms/update, command {s['median_command_wall_s']} s, "
            f"start-up {s['median_start_up_s']} s, validation {s['validation_accuracy']}"
        )
    print(
        f"bench: Ray's time per update is {result['ray_per_update_vs_elastic']}x the elastic agent's; "
        f"wrote {OUT.relative_to(ROOT)}"
    )


if __name__ == "__main__":
    main()
