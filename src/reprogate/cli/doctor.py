"""`reprogate doctor`: does this machine compute the committed bits? (pipeline/doctor.py)"""

from __future__ import annotations

import argparse
from pathlib import Path

from reprogate.specs.loader import find_root
from reprogate.utils.errors import UserError


def _doctor(args: argparse.Namespace) -> int:
    from reprogate.pipeline import doctor

    root = find_root(Path.cwd())
    if not (root / "params.yaml").is_file():
        raise UserError(f"{root}: no params.yaml here or above: run `reprogate doctor` inside a project.")
    if args.fingerprint_json:
        return doctor.measure_to(root, args.fingerprint_json)
    return doctor.run(root, write_reference=args.write, ci=args.ci, emulate=args.emulate)


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
    d.add_argument(
        "--emulate",
        action="store_true",
        help="also run the probe as an emulated Intel and an emulated AMD CPU (QEMU, `make qemu`; "
        "minutes) and require every op equal in all three; with --write, record all three",
    )
    d.add_argument("--fingerprint-json", type=Path, help=argparse.SUPPRESS)
    d.set_defaults(func=_doctor)
