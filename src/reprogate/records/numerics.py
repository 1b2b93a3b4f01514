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
    cpu: str  # the brand string CPUID reports
    vendor: str  # GenuineIntel, AuthenticAMD, ... (CPUID: under emulation, the emulated CPU's)
    flags: list[str]  # the level-relevant CPU flags it has (avx2, avx512f, ...)
    made: str  # UTC date
    commit: str  # the project's commit it was made at
    ops: dict[str, dict[str, str]]  # class -> op -> digest
    # IEEE-exact op -> [results not correctly rounded, inputs] (train/exact.py): not compared
    # between machines; an op with wrong results is one whose bits are the vendor's.
    exact: dict[str, list[int]] = Field(default_factory=dict)
    emulated: str | None = None  # the QEMU command that computed it, when not this CPU itself


class NumericReference(Record):
    """Fingerprints under one pin: only comparable with the same variables and library versions."""

    pin: dict[str, str] = Field(
        description="the environment the pin sets (and 'unset:NAME' for what it removes)"
    )
    versions: dict[str, str] = Field(description="torch, numpy, transformers, the C library")
    machines: dict[str, MachineFingerprint] = Field(description="keyed by vendor and CPU name")
