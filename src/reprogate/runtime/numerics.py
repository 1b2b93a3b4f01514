"""The pinned numeric environment: which floating-point code paths every stage process takes.

The same weights on two CPUs differ when their math libraries pick different kernels: ATen's
vectorised ops (AVX2 vs AVX-512 widths reduce in another order), MKL's sgemm (it dispatches by
CPU unless conditional numerical reproducibility fixes a branch), numpy's SIMD loops, OpenBLAS.
Each reads its choice once, from the environment, when it loads; so `pin()` runs before torch or
numpy is imported (reprogate's entry point, `python -m reprogate`), children inherit the
variables, and `check()` refuses a process where a library loaded before the pin. Thread counts
are each model spec's `threads` (torch.set_num_threads); MKL may not shrink them (MKL_DYNAMIC).
Measured effects (docs/reproducibility.md): ATen capability, MKL branch and thread count each
change a training run's bits; oneDNN and fbgemm caps did not on our models, pinned all the same.
Across vendors, only MKL's COMPATIBLE branch is documented to agree (`gemm: portable`), and
`reprogate doctor` (runtime/probe.py) tells in seconds whether a machine computes the reference bits.
"""

from __future__ import annotations

import functools
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from reprogate.specs.params import Numerics
from reprogate.utils import paths
from reprogate.utils.errors import UserError

# Set when a process pinned its environment, so its children know it was done before import.
PINNED_ENV = "REPROGATE_NUMERICS"
# Per level: the CPU flags it needs (/proc/cpuinfo names), then each library's variable.
LEVELS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "x86-64-v2": (
        ("sse4_2", "popcnt", "ssse3"),
        {
            "ATEN_CPU_CAPABILITY": "default",
            "MKL_CBWR": "SSE4_2",
            "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
            "ONEDNN_MAX_CPU_ISA": "SSE41",
            "DNNL_MAX_CPU_ISA": "SSE41",
            "NPY_DISABLE_CPU_FEATURES": "X86_V3,X86_V4,AVX512_ICL,AVX512_SPR",
            "OPENBLAS_CORETYPE": "Nehalem",
        },
    ),
    "x86-64-v3": (
        ("avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "abm"),
        {
            "ATEN_CPU_CAPABILITY": "avx2",
            "MKL_CBWR": "AVX2",
            "MKL_ENABLE_INSTRUCTIONS": "AVX2",
            "ONEDNN_MAX_CPU_ISA": "AVX2",
            "DNNL_MAX_CPU_ISA": "AVX2",
            "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
            "NPY_DISABLE_CPU_FEATURES": "X86_V4,AVX512_ICL,AVX512_SPR",
            "OPENBLAS_CORETYPE": "Haswell",
        },
    ),
    "x86-64-v4": (
        ("avx2", "fma", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
        {
            "ATEN_CPU_CAPABILITY": "avx512",
            "MKL_CBWR": "AVX512",
            "MKL_ENABLE_INSTRUCTIONS": "AVX512",
            "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
            "DNNL_MAX_CPU_ISA": "AVX512_CORE",
            "FBGEMM_ENABLE_INSTRUCTIONS": "AVX512",
            "NPY_DISABLE_CPU_FEATURES": "AVX512_ICL,AVX512_SPR",
            "OPENBLAS_CORETYPE": "SkylakeX",
        },
    ),
}
# oneDNN reads its cap under both names (DNNL_ is the older): the pin sets both, so a caller's
# DNNL_MAX_CPU_ISA cannot bend it.
# Whatever the level: MKL keeps the thread count it is given, and numpy's BLAS runs on one
# thread (its work here is small; a thread split can change a reduction's order).
ALWAYS = {"MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE", "OPENBLAS_NUM_THREADS": "1"}
# A caller's variables that bend the pinned paths: MKL's vendor override (MKL_DEBUG_CPU_TYPE),
# and thread counts other than the spec's (a thread split can change a reduction's order; the
# spec's `threads` sets them in-process). The pin removes them and `check` refuses them.
# NPY_ENABLE_CPU_FEATURES beside the pin's NPY_DISABLE_CPU_FEATURES makes numpy refuse to load.
UNSET_ALWAYS = ("MKL_DEBUG_CPU_TYPE", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "NPY_ENABLE_CPU_FEATURES")
# Every variable a level may set: forwarded to workers a launcher does not start itself (Ray).
VARIABLES = tuple(sorted({k for _, env in LEVELS.values() for k in env} | set(ALWAYS) | {PINNED_ENV}))
# What ATen reports (torch.backends.cpu.get_cpu_capability) when the pin took.
ATEN_REPORTS = {"default": "DEFAULT", "avx2": "AVX2", "avx512": "AVX512"}


# `gemm: portable`: MKL's one branch that Intel documents to give the same results on Intel and
# other vendors' CPUs. MKL on AMD ignores every other branch and its instruction cap (measured:
# SSE4_2, AVX2 and no pin gave the same products there, and other bits than Intel's AVX2 branch),
# so `level` reproduces only among one vendor's CPUs. An instruction cap in the environment would
# override the branch, so `portable` sets none and refuses a process that has one.
PORTABLE_GEMM = {"MKL_CBWR": "COMPATIBLE"}
UNSET_BY_PORTABLE = ("MKL_ENABLE_INSTRUCTIONS",)


def variables(numerics: Numerics) -> dict[str, str]:
    """The environment a level pins (`native`: only the thread rules)."""
    if numerics.cpu_level == "native":
        return dict(ALWAYS)
    env = {**LEVELS[numerics.cpu_level][1], **ALWAYS}
    if numerics.gemm == "portable":
        env = {k: v for k, v in env.items() if k not in UNSET_BY_PORTABLE} | PORTABLE_GEMM
    return env


def unset(numerics: Numerics) -> tuple[str, ...]:
    """Variables the pin removes from the environment (they would bend it)."""
    portable = numerics.cpu_level != "native" and numerics.gemm == "portable"
    return (*UNSET_ALWAYS, *(UNSET_BY_PORTABLE if portable else ()))


@dataclass(frozen=True)
class Cpu:
    """The CPU this process computes on, as its CPUID instruction says: under QEMU's user-mode
    emulation that is the emulated CPU, while /proc/cpuinfo still describes the host."""

    vendor: str  # GenuineIntel, AuthenticAMD, ...
    brand: str
    flags: frozenset[str]  # /proc/cpuinfo's names (avx2, fma, avx512f, ...)


@functools.cache
def cpu() -> Cpu:
    try:
        from cpuinfo import cpuinfo

        probe = cpuinfo.CPUID(cpuinfo.Trace(False, False))
        top = probe.get_max_extension_support()
        return Cpu(probe.get_vendor_id(), probe.get_processor_brand(top), frozenset(probe.get_flags(top)))
    except Exception:  # not x86, or executable memory refused: the kernel's view instead
        return _proc_cpu()


def _proc_cpu() -> Cpu:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []

    def field(name: str) -> str:
        return next((ln.partition(":")[2].strip() for ln in lines if ln.startswith(name)), "")

    brand = field("model name") or platform.processor() or platform.machine()
    return Cpu(field("vendor_id") or platform.machine(), brand, frozenset(field("flags").split()))


def refuse_unless_honoured(numerics: Numerics, where: str) -> None:
    """A CPU that cannot run the pinned level is refused: it would take other code paths and
    produce other bits than the commit says, silently."""
    level = numerics.cpu_level
    if level == "native":
        return
    fix = (
        f"Run on an x86-64 CPU that has them, or set numerics.cpu_level in {paths.PARAMS} to a level "
        "this CPU meets (or `native`, which pins nothing and reproduces only on this kind of CPU); "
        "either change rebuilds every model, since it is another numeric environment."
    )
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise UserError(
            f"{where}: field 'numerics.cpu_level' is '{level}', an x86-64 level, but this machine is "
            f"{platform.machine()} ({cpu().brand}), whose float kernels are others. {fix}"
        )
    missing = [f for f in LEVELS[level][0] if f not in cpu().flags]
    if missing:
        raise UserError(
            f"{where}: field 'numerics.cpu_level' is '{level}', but this CPU ({cpu().brand}) lacks "
            f"{', '.join(missing)}, so it cannot take the pinned code paths. {fix}"
        )


def read(root: Path) -> Numerics:
    """params.yaml's numerics (only that field: see specs.loader.load_numerics)."""
    from reprogate.specs.loader import load_numerics

    return load_numerics(root)


def pin(root: Path | None) -> Numerics | None:
    """Set the environment of the project at `root` in this process, before torch or numpy load.
    None (nothing pinned) outside a project: `reprogate --help`, a deployed model folder."""
    if root is None or not (root / paths.PARAMS).is_file():
        return None
    numerics = read(root)
    refuse_unless_honoured(numerics, str(root / paths.PARAMS))
    os.environ.update(variables(numerics))
    for name in unset(numerics):
        os.environ.pop(name, None)
    os.environ[PINNED_ENV] = json.dumps(numerics.model_dump(mode="json"), sort_keys=True)
    return numerics


def check(root: Path) -> None:
    """Refuse a process whose numeric environment is not the project's pin (torch loaded
    before `pin`, or a variable changed since)."""
    numerics = read(root)
    want = variables(numerics)
    wrong = {k: os.environ.get(k) for k, v in want.items() if os.environ.get(k) != v}
    wrong |= {k: os.environ[k] for k in unset(numerics) if k in os.environ}
    capability = aten_capability()
    expected = ATEN_REPORTS.get(want.get("ATEN_CPU_CAPABILITY", ""), capability)
    if wrong or capability != expected:
        seen = ", ".join(f"{k}={v!r}" for k, v in wrong.items()) or f"ATen runs {capability}"
        wanted = ", ".join([*(f"{k}={v}" for k, v in want.items()), *(f"no {k}" for k in unset(numerics))])
        raise UserError(
            f"{root / paths.PARAMS}: field 'numerics' is cpu_level '{numerics.cpu_level}', gemm "
            f"'{numerics.gemm}', but this process does not run under it ({seen}; the pin is {wanted}, "
            f"ATen {expected}): the math libraries read the "
            "pin when they load. Run through `reprogate ...` or `python -m reprogate ...`, which pin "
            "before torch loads; from Python, call reprogate.runtime.numerics.pin(ROOT) before "
            "importing torch."
        )


def aten_capability() -> str:
    import torch

    return torch.backends.cpu.get_cpu_capability()
