"""numerics/<level>-<gemm>.json: the numeric fingerprints that `reprogate doctor` compares a
machine with, one per machine that made or checked a commit under that pin.

| file                          | model              | written by               | read by          |
| ----------------------------- | ------------------ | ------------------------ | ---------------- |
| numerics/<level>-<gemm>.json  | NumericReference   | `reprogate doctor --write` | `reprogate doctor` |
"""

from __future__ import annotations

from pydantic import Field

from reprogate.records.base import Record


class MachineFingerprint(Record):
    cpu: str  # /proc/cpuinfo's model name
    vendor: str  # GenuineIntel, AuthenticAMD, ...
    flags: list[str]  # the level-relevant CPU flags it has (avx2, avx512f, ...)
    made: str  # UTC date
    commit: str  # the project's commit it was made at
    ops: dict[str, dict[str, str]]  # class -> op -> digest


class NumericReference(Record):
    """Fingerprints under one pin: only comparable with the same variables and library versions."""

    pin: dict[str, str] = Field(
        description="the environment the pin sets (and 'unset:NAME' for what it removes)"
    )
    versions: dict[str, str] = Field(description="torch, numpy, transformers, the C library")
    machines: dict[str, MachineFingerprint] = Field(description="keyed by vendor and CPU name")
