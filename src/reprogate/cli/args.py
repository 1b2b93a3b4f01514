"""Argument types of the command line: a bad value is one line naming what is accepted."""

from __future__ import annotations

import argparse


def port(value: str) -> int:
    port = int(value) if value.isdigit() else -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port; use a number from 0 to 65535")
    return port


def positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 3600:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds; use e.g. 10 (at most 3600)")
    return seconds


def wait_ms(value: str) -> float:
    try:
        ms = float(value)
    except ValueError:
        ms = -1.0
    if not 0 <= ms <= 1000:
        raise argparse.ArgumentTypeError(f"{value!r} is not a wait in milliseconds; use e.g. 2 (0 to 1000)")
    return ms


def positive_int(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive whole number")
    return int(value)
