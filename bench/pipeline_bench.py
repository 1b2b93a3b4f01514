"""The default pipeline from nothing to gate, against the targets of the gate issue
(numbers for README; not a test).

    make bench-pipeline      # or: python bench/pipeline_bench.py

Clones the committed HEAD into a temporary folder (no data, features, models or DVC cache),
runs `dvc repro --force` there with this checkout's virtual environment and data mirror, and
prints the wall time as a ratio of the 5-minute target, then each quality number of every
candidate against its target. A fresh clone also needs `make venv` (about a minute here);
that is set-up, outside the target.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from reprogate.data.fetch import mirror_dirs

ROOT = Path(__file__).resolve().parents[1]
WALL_TARGET_S = 300.0
# (metric, target, higher is better)
QUALITY_TARGETS = [
    ("test accuracy", 0.94, True),
    ("ECE after calibration", 0.02, False),
    ("oos_test false-positive action rate", 0.02, False),
    ("coverage (in-scope test acted on)", 0.90, True),
]


def quality(clone: Path, name: str) -> list[float]:
    sets = json.loads((clone / "results" / name / "eval.json").read_text())["sets"]
    test = sets["test"]
    fp = max(s["false_positive_action_rate"] for s in sets.values() if s["kind"] == "out_of_scope")
    return [test["accuracy"], test["ece_after"], fp, test["coverage"]]


def main() -> None:
    env = dict(os.environ, REPROGATE_MIRROR=os.pathsep.join(map(str, mirror_dirs(ROOT))))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        clone = Path(tmp) / "repo"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        start = time.perf_counter()
        proc = subprocess.run(["dvc", "repro", "--force"], cwd=clone, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(f"pipeline bench: dvc repro failed after {wall:.0f} s:\n{proc.stderr[-3000:]}")
        gate = json.loads((clone / "results" / "gate.json").read_text())
        names = list(gate["candidates"])
        print(
            f"dvc repro --force, nothing to gate: {wall:.1f} s; target {WALL_TARGET_S:.0f} s; "
            f"ratio {wall / WALL_TARGET_S:.2f} (<= 1 meets it)"
        )
        for name in names:
            for (label, target, higher), value in zip(QUALITY_TARGETS, quality(clone, name), strict=True):
                met = value >= target if higher else value <= target
                print(
                    f"  {name:>14}  {label:<38} {value:.4f}  target {'>=' if higher else '<='} "
                    f"{target}  {'met' if met else 'NOT met'}"
                )
        chosen = gate.get("chosen") or "none"
        print(f"pipeline bench: {wall:.0f} s ({wall / WALL_TARGET_S:.2f}x the target); gate chose {chosen}")


if __name__ == "__main__":
    main()
