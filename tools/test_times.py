"""Per-file time of a test run, from pytest's JUnit XML: the table docs/testing.md keeps.

    make test PYTEST_ARGS=--junitxml=/tmp/junit.xml
    python tools/test_times.py /tmp/junit.xml            # a Markdown table, slowest file first

A test's time is its setup, call and teardown (pytest's default for JUnit), so a shared
fixture is charged to the test that built it. Worker time is the sum over tests; with N
workers the run's wall time is at least that sum over N.
"""

from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET
from pathlib import Path


def per_file(junit: Path) -> tuple[dict[str, float], dict[str, int], dict[str, str]]:
    """Seconds, number of tests and the slowest test of each test file."""
    seconds: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.Counter()
    slowest: dict[str, tuple[float, str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "?")
        name, t = f"tests/{'/'.join(module.split('.')[1:])}.py", float(case.get("time", 0))
        seconds[name] += t
        count[name] += 1
        if t > slowest.get(name, (-1.0, ""))[0]:
            slowest[name] = (t, case.get("name", "?"))
    return seconds, count, {k: f"{v[1][:60]} ({v[0]:.0f} s)" for k, v in slowest.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path, help="pytest's --junitxml file")
    parser.add_argument("--top", type=int, default=25, help="files listed; the rest are summed")
    args = parser.parse_args()
    seconds, count, slowest = per_file(args.junit)
    order = sorted(seconds, key=seconds.__getitem__, reverse=True)
    print("| file | tests | worker s | slowest test |\n| --- | --- | --- | --- |")
    for f in order[: args.top]:
        print(f"| `{f}` | {count[f]} | {seconds[f]:.0f} | {slowest[f]} |")
    rest = order[args.top :]
    if rest:
        n, s = sum(count[f] for f in rest), sum(seconds[f] for f in rest)
        print(f"| {len(rest)} other files | {n} | {s:.0f} | |")
    print(f"| **all** | {sum(count.values())} | {sum(seconds.values()):.0f} | |")


if __name__ == "__main__":
    main()
