"""Does the language model train to the same bits in every process? The per-process flake check.

lm's resume-check spec (the `gpt` spec at its resume_check length: 12 updates, checkpoints every
4, every validation point) trains in `--runs` fresh processes, each beside a busy loop that keeps
a core loaded (the flake was seen 1 run in 8 to 1 in 24, more often under load); then
`--resume-checks` kill-and-resume checks, each killed at the spec's kill point and compared with
the first run field by field at tolerance zero. Every run must give one hash.

    python bench/lm_flake.py [--runs 40] [--resume-checks 20] [--out bench/results/lm_flake.json]

Run it from a project whose lm/ has tokens (`make repro-lm`, or `cd lm && dvc repro tokenize@gpt`).
Writes the hashes with their counts, the resume verdicts, the CPU and the pin.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
LM = REPO / "lm"
BUSY = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def final_hash(work: Path) -> str:
    """sha256 over the final weights and the last checkpoint's optimizer state."""
    m = hashlib.sha256((work / "model" / "model.safetensors").read_bytes())
    for f in sorted((work / "checkpoints").rglob("optimizer*")):
        m.update(f.read_bytes())
    return m.hexdigest()[:16]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--resume-checks", type=int, default=20)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "lm_flake.json")
    args = ap.parse_args()
    from reprogate.runtime import numerics

    numerics.pin(LM)  # the children inherit the pin, as under dvc repro
    from reprogate.specs.loader import load_spec
    from reprogate.specs.model import ModelSpec
    from reprogate.train import resume_check

    spec = load_spec(LM / "specs" / "models" / "gpt.yaml", ModelSpec)
    base = LM / "runs" / "flake"  # git-ignored
    base.mkdir(parents=True, exist_ok=True)
    spec_path = base / "gpt.yaml"
    spec_path.write_text(yaml.safe_dump(resume_check.derived_spec(spec), sort_keys=False))
    hashes: list[str] = []
    checks: list[dict] = []
    started = time.perf_counter()
    busy = subprocess.Popen([sys.executable, "-c", BUSY.format(seconds=4 * 3600)])
    try:
        for i in range(args.runs):
            work = base / f"run{i}"
            done = resume_check.run_child(LM, "gpt", spec_path, work)
            assert done["returncode"] == 0, f"run {i} failed: see {work.parent / (work.name + '.log')}"
            hashes.append(final_hash(work))
            print(f"lm_flake: run {i + 1}/{args.runs}: {hashes[-1]}", file=sys.stderr)
        reference = resume_check.final_checkpoint(base / "run0")
        for i in range(args.resume_checks):
            work = base / f"resume{i}"
            resume_check.kill_and_resume(LM, "gpt", spec_path, work, f"step:{spec.resume_check.kill_after}")
            fields = resume_check.compare(reference, resume_check.final_checkpoint(work), tolerance=0.0)
            failed = sorted(k for k, f in fields.items() if f["verdict"] != "pass")
            checks.append({"passed": not failed, "failed_fields": failed})
            print(f"lm_flake: resume check {i + 1}/{args.resume_checks}: {failed or 'pass'}", file=sys.stderr)
    finally:
        busy.kill()
    counts = collections.Counter(hashes)
    result = {
        "runs": len(hashes),
        "hashes": dict(counts.most_common()),
        "resume_checks_passed": sum(c["passed"] for c in checks),
        "resume_checks": len(checks),
        "failed_fields": sorted({f for c in checks for f in c["failed_fields"]}),
        "cpu": f"{numerics.cpu().vendor} {numerics.cpu().brand}",
        "pin": os.environ.get(numerics.PINNED_ENV),
        "seconds": round(time.perf_counter() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"lm_flake: {len(hashes)} runs gave {len(counts)} hash(es); resume checks passed "
        f"{result['resume_checks_passed']} of {len(checks)}; {result['seconds']} s -> {args.out}"
    )
    return 0 if len(counts) == 1 and all(c["passed"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
