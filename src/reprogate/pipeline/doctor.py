"""`reprogate doctor`: does this machine compute the committed bits? In seconds, not a rebuild.

It runs the project's probe (train/probe.py) under the project's pin and compares each op's
digest with the fingerprints committed in numerics/<level>-<gemm>.json, one per machine that
made or checked the commit. Equal everywhere: `make repro` here gives the committed outputs.
An op that differs names its class and the stages that use it. `--write` records this machine.

A difference fails (`--ci`) only once the pin is established across vendors, i.e. the file holds
fingerprints of two CPU vendors that agree with each other; before that it is reported, since one
vendor's reference alone cannot say which side a difference is on.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import platform
import sys
import time
from pathlib import Path

from tqdm import tqdm

from reprogate.records.base import load, write
from reprogate.records.numerics import MachineFingerprint, NumericReference
from reprogate.runtime import numerics
from reprogate.specs.families.encoder import resolve_encoder_path
from reprogate.utils import git
from reprogate.utils.errors import UserError

FOLDER = Path("numerics")


def reference_path(root: Path) -> Path:
    n = numerics.read(root)
    return root / FOLDER / f"{n.cpu_level}-{n.gemm}.json"


def pin_environment(root: Path) -> dict[str, str]:
    n = numerics.read(root)
    return numerics.variables(n) | {f"unset:{k}": "" for k in numerics.unset(n)}


def versions() -> dict[str, str]:
    import numpy
    import torch

    return {
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "transformers": importlib.metadata.version("transformers"),
        "libc": " ".join(platform.libc_ver()),
    }


def this_machine(
    root: Path, ops: dict[str, dict[str, str]], exact: dict[str, list[int]]
) -> MachineFingerprint:
    wanted = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vnni", "amx_tile"}
    cpu = numerics.cpu()
    return MachineFingerprint(
        cpu=cpu.brand,
        vendor=cpu.vendor,
        flags=sorted(wanted & cpu.flags),
        made=dt.datetime.now(dt.UTC).date().isoformat(),
        commit=(git.head(root) or "uncommitted")[:12],
        ops=ops,
        exact=exact,
    )


def _differences(ops: dict[str, dict[str, str]], ref: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    """{class: [op, ...]} of ops whose digests differ (or that one side lacks)."""
    out: dict[str, list[str]] = {}
    for cls in sorted(set(ops) | set(ref)):
        mine, theirs = ops.get(cls, {}), ref.get(cls, {})
        bad = [op for op in sorted(set(mine) | set(theirs)) if mine.get(op) != theirs.get(op)]
        if bad:
            out[cls] = bad
    return out


def established(reference: NumericReference) -> bool:
    """Two vendors' fingerprints in the file, equal to each other: the pin holds across vendors."""
    by_vendor = {m.vendor: m.ops for m in reference.machines.values()}
    return len(by_vendor) >= 2 and all(
        not _differences(o, next(iter(by_vendor.values()))) for o in by_vendor.values()
    )


def covered(reference: NumericReference, cpu: numerics.Cpu) -> bool:
    """Whether a CPU of this one's kind (its vendor, with or without AVX-512) computed a
    fingerprint in the file, natively or emulated. Emulation covers both vendors' AVX2 CPUs; an
    Intel CPU with AVX-512 is not covered until one records itself (docs/reproducibility.md)."""
    wide = "avx512f" in cpu.flags
    return any(m.vendor == cpu.vendor and ("avx512f" in m.flags) == wide for m in reference.machines.values())


def binding(reference: NumericReference) -> tuple[bool, str]:
    """(does a difference here fail CI, and if not, why)."""
    if not established(reference):
        return False, "The pin is not yet established across vendors: reported, not failed."
    cpu = numerics.cpu()
    if not covered(reference, cpu):
        kind = f"{cpu.vendor} {'with' if 'avx512f' in cpu.flags else 'without'} AVX-512"
        return False, (
            f"No CPU of this kind ({kind}) is in the reference, so the pin is not established for "
            "it: reported, not failed. Once the difference is understood, record it with "
            "`reprogate doctor --write`."
        )
    return True, ""


def read_reference(path: Path, pin: dict[str, str]) -> NumericReference | None:
    if not path.is_file():
        return None
    fix = f"delete {path} and run `reprogate doctor --write` on the machine whose outputs are committed."
    ref = load(path, NumericReference, fix)
    if ref.pin != pin:
        raise UserError(f"{path}: field 'pin' is {ref.pin}, but params.yaml pins {pin} here; {fix}")
    return ref


def _probe(root: Path) -> tuple[dict[str, dict[str, str]], float]:
    from reprogate.train import probe

    try:
        encoder = resolve_encoder_path(probe.ENCODER, root)
    except UserError:
        encoder = None  # an environment without the MiniLM package probes everything else
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar here, not the encoder's loading bar inside it
    t0 = time.perf_counter()
    with tqdm(total=len(probe.CLASSES), desc="doctor", unit="class", file=sys.stderr, leave=False) as bar:
        ops = probe.fingerprint(encoder, lambda cls: (bar.set_postfix_str(cls), bar.update()))
    return ops, time.perf_counter() - t0


def run(root: Path, write_reference: bool = False, ci: bool = False, emulate: bool = False) -> int:
    numerics.check(root)
    pin, now = pin_environment(root), versions()
    path = reference_path(root)
    print(f"doctor: pin {', '.join(f'{k}={v}' if v else k for k, v in sorted(pin.items()))}")
    if emulate:
        return _emulated(root, path, pin, now, write_reference)
    if write_reference:
        return _write(root, path, pin, now, [_measured(root)])
    reference = read_reference(path, pin)
    shown = path.relative_to(root)
    if reference is None:
        raise UserError(
            f"{shown} does not exist: no machine has recorded the fingerprint of this pin "
            f"(numerics in params.yaml). On the machine whose outputs are committed, run "
            f"`reprogate doctor --write` and commit {shown}."
        )
    if not reference.machines:
        raise UserError(
            f"{shown}: field 'machines' is empty: there is no fingerprint to compare this machine "
            "with, so nothing can be called equal. On the machine whose outputs are committed, run "
            f"`reprogate doctor --write` and commit {shown}."
        )
    if reference.versions != now:
        raise UserError(
            f"{shown}: field 'versions' is {reference.versions}, but this environment has {now}: "
            "another library build computes other bits whatever the CPU. Run `make venv` (it "
            "installs requirements.lock), or record this environment with `reprogate doctor --write`."
        )
    return _compare(root, reference, ci)


def measure_to(root: Path, out: Path) -> int:
    """This process's fingerprint into `out`: what `--emulate` runs under QEMU."""
    numerics.check(root)
    write(out, _measured(root))
    return 0


def _emulated(root: Path, path: Path, pin: dict[str, str], now: dict[str, str], keep: bool) -> int:
    """Native, an emulated Intel and an emulated AMD: every op must be equal in all three."""
    from reprogate.pipeline import emulate

    emulate.emulator()  # named before minutes of native probing
    machines = [_measured(root)]
    for vendor, model in emulate.CPUS.items():
        print(f"doctor: the probe as {vendor} (`{emulate.QEMU} -cpu {model}`; minutes under emulation)")
        machines.append(emulate.fingerprint(root, model))
        print_exactness(machines[-1])
    agree = _agree({emulate.key(m): m for m in machines})
    if keep:
        _write(root, path, pin, now, machines)
    return 0 if agree else 1


def _agree(machines: dict[str, MachineFingerprint]) -> bool:
    from reprogate.train.probe import CLASSES, class_digest

    first = next(iter(machines.values()))
    diffs = {name: _differences(m.ops, first.ops) for name, m in machines.items()}
    width = max(len(c) for c in first.ops)
    for cls, cls_ops in first.ops.items():
        bad = sorted({op for d in diffs.values() for op in d.get(cls, [])})
        verdict = f"DIFFERS: {', '.join(bad)} ({CLASSES[cls]})" if bad else f"equal in all {len(machines)}"
        print(f"  {cls:<{width}} {len(cls_ops):>3} ops  {class_digest(cls_ops)}  {verdict}")
    names = "; ".join(machines)
    if any(diffs.values()):
        count = len({(c, o) for d in diffs.values() for c, found in d.items() for o in found})
        print(f"doctor: {count} op(s) differ between {names}: their bits depend on the vendor")
        return False
    print(f"doctor: every op equal for {names}")
    return True


def _write(
    root: Path, path: Path, pin: dict[str, str], now: dict[str, str], measured: list[MachineFingerprint]
) -> int:
    """The measured fingerprints into the file; machines of another pin or build are dropped,
    and named."""
    from reprogate.pipeline.emulate import key

    if not path.parent.resolve().is_relative_to(root.resolve()):
        raise UserError(
            f"{path.parent} leads outside the project (to {path.parent.resolve()}), and doctor --write "
            f"would write there; make {path.parent.relative_to(root)} a folder of the project "
            "(`git rm` the link, `mkdir`), then write again."
        )
    old = NumericReference(pin=pin, versions=now, machines={})
    replaced = ""
    if path.is_file():
        try:
            old = read_reference(path, pin) or old
        except UserError as e:  # another pin's, or not a reference: replaced, and said so
            replaced = f"; replaced what was there, which this pin cannot keep ({str(e).split('; ')[0]})"
    kept = old.machines if old.versions == now else {}
    dropped = sorted(set(old.machines) - set(kept))
    machines = {**kept, **{key(m): m for m in measured}}
    write(path, NumericReference(pin=pin, versions=now, machines=machines))
    shown = path.relative_to(root)
    gone = f"; dropped (another library build): {', '.join(dropped)}" if dropped else ""
    gone += replaced
    print(f"doctor: wrote {len(measured)} fingerprint(s) to {shown} ({len(machines)} machine(s){gone})")
    return 0


def _measured(root: Path) -> MachineFingerprint:
    from reprogate.train import exact

    ops, took = _probe(root)
    checked = {op: list(found) for op, found in exact.check().items()}
    me = this_machine(root, ops, checked)
    print(f"doctor: this machine: {me.cpu} ({me.vendor}; {', '.join(me.flags)}); probe {took:.1f} s")
    print_exactness(me)
    return me


def print_exactness(me: MachineFingerprint) -> None:
    """Each IEEE-exact op: correctly rounded on every input, or named as the vendor's."""
    width = max((len(op) for op in me.exact), default=0)
    print(f"  exactness ({me.vendor}{', ' + me.emulated if me.emulated else ''}):")
    for op, (wrong, n) in sorted(me.exact.items()):
        verdict = (
            f"correctly rounded ({n:,} inputs)"
            if wrong == 0
            else f"NOT correctly rounded: {wrong:,} of {n:,} (vendor-dependent bits)"
        )
        print(f"    {op:<{width}} {verdict}")


def _compare(root: Path, reference: NumericReference, ci: bool) -> int:
    from reprogate.train.probe import CLASSES, class_digest

    ops = _measured(root).ops
    diffs = {name: _differences(ops, m.ops) for name, m in reference.machines.items()}
    width = max(len(c) for c in ops)
    for cls, cls_ops in ops.items():
        bad = sorted({op for d in diffs.values() for op in d.get(cls, [])})
        verdict = f"DIFFERS: {', '.join(bad)} ({CLASSES[cls]})" if bad else "equal"
        print(f"  {cls:<{width}} {len(cls_ops):>3} ops  {class_digest(cls_ops)}  {verdict}")
    made = "; ".join(f"{n} at {m.commit} ({m.made})" for n, m in reference.machines.items())
    if not any(diffs.values()):
        print(f"doctor: every op equal to the reference ({made}): `make repro` here gives the committed bits")
        return 0
    count = len({(c, o) for d in diffs.values() for c, found in d.items() for o in found})
    sure, why = binding(reference)
    print(
        f"doctor: {count} op(s) differ from the reference ({made}): a rebuild here gives other bits in "
        f"the stages that use them (docs/reproducibility.md). {why}"
    )
    return 1 if (sure or not ci) else 0
