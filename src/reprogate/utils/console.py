"""Where a stage's progress lines go: standard error, flushed, so that DVC shows each as it comes
and standard output keeps only what a command prints as its answer."""

from __future__ import annotations

import sys


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
