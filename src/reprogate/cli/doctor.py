"""`reprogate doctor`: does this machine compute the committed bits? (pipeline/doctor.py)"""

from __future__ import annotations

import argparse
from pathlib import Path

from reprogate.specs.loader import find_root
from reprogate.utils.errors import UserError


def _doctor(args: argparse.Namespace) -> int:
    from reprogate.pipeline.doctor import run

    root = find_root(Path.cwd())
    if not (root / "params.yaml").is_file():
        raise UserError(f"{root}: no params.yaml here or above: run `reprogate doctor` inside a project.")
    return run(root, write_reference=args.write, ci=args.ci)


def add_parser(sub) -> None:
    d = sub.add_parser(
        "doctor", help="does this machine compute the committed bits? (a probe of every op class, seconds)"
    )
    d.add_argument("--write", action="store_true", help="record this machine's fingerprint in numerics/")
    d.add_argument(
        "--ci",
        action="store_true",
        help="fail on a difference only once two CPU vendors' fingerprints agree (CI's check)",
    )
    d.set_defaults(func=_doctor)
