"""`reprogate` and `python -m reprogate`: pin the numeric environment, then the command line.

The pin must come before anything imports numpy or torch (they read it when they load), so this
module imports nothing of reprogate's but the pin until it is set.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    from reprogate.runtime.numerics import pin
    from reprogate.specs.loader import find_root
    from reprogate.utils.errors import UserError

    try:
        pin(find_root(Path.cwd()))
    except UserError as e:
        print(f"reprogate: {e}", file=sys.stderr)
        return 2
    from reprogate.cli.main import main as cli

    return cli()


if __name__ == "__main__":
    sys.exit(main())
