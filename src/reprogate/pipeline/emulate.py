"""The other vendor, emulated: the project's probe under QEMU's user-mode emulator, presenting an
Intel or an AMD CPU's CPUID to this machine's own Python, torch and numpy.

MKL, oneDNN, ATen and numpy pick their code paths from CPUID, so an emulated Intel takes the
paths a real Intel takes; QEMU computes the IEEE-exact instructions exactly, and the approximate
ones (rcpps, rsqrtps, x87 transcendentals) its own way. So: emulated Intel against emulated AMD
differ only where a library dispatches on the vendor, and native against emulated only where a
path uses an instruction whose result the vendor defines. Both CPUs are AVX2 ones (no AVX-512),
the paths the x86-64-v3 pin caps every library to.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from reprogate.records.base import load
from reprogate.records.numerics import MachineFingerprint
from reprogate.utils.errors import UserError

# QEMU's CPU models: one of each vendor, both AVX2 and FMA, neither AVX-512.
CPUS = {"GenuineIntel": "Haswell-v4", "AuthenticAMD": "EPYC-Milan"}
QEMU = "qemu-x86_64"
REQUIRE = "REPROGATE_REQUIRE_QEMU"  # CI: a missing emulator fails, never skips


def emulator() -> str:
    found = shutil.which(QEMU)
    if found is None:
        raise UserError(
            f"{QEMU} is not installed, and `reprogate doctor --emulate` runs the probe under it as an "
            "Intel and an AMD CPU. Install it with `make qemu` (Debian's qemu-user: "
            "`sudo apt-get install qemu-user`), then run this again."
        )
    return found


def fingerprint(root: Path, model: str) -> MachineFingerprint:
    """The probe's fingerprint as QEMU's CPU `model` computes it (minutes: 30-60x slower)."""
    qemu = emulator()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "fingerprint.json"
        cmd = [
            qemu,
            "-cpu",
            model,
            sys.executable,
            "-m",
            "reprogate",
            "doctor",
            "--fingerprint-json",
            str(out),
        ]
        proc = subprocess.run(cmd, cwd=root, stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0 or not out.is_file():
            raise UserError(
                f"the probe under `{QEMU} -cpu {model}` failed (exit {proc.returncode}): "
                f"{proc.stdout.strip()[-400:]}; run `{' '.join(cmd)}` in {root} to see it whole."
            )
        me = load(out, MachineFingerprint, "a probe under emulation wrote it; run it again")
    return me.model_copy(update={"emulated": f"{QEMU} -cpu {model}"})


def key(me: MachineFingerprint) -> str:
    """The fingerprint's name in numerics/<pin>.json: vendor and CPU, and how it was computed."""
    return f"{me.vendor} {me.cpu}" + (f" (emulated: {me.emulated})" if me.emulated else "")
