"""The exactness section of the probe: ops IEEE 754 defines exactly, each compared with a
correctly rounded reference on inputs that hit hard rounding cases.

An op here either returns the one correctly rounded result for every input, or it is named as
vendor-dependent: its bits are whatever the library's code path for this CPU computes (an
approximate instruction refined, or a vendor's own kernel). The references: float64 results
rounded once to the narrower format, which is exact for sqrt and division (53 >= 2*24 + 2 bits,
so the double rounding is innocuous), and integer arithmetic on bit patterns for bfloat16.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

N = 1 << 16  # per input family: seconds on any CPU, even emulated


def _f32(bits: np.ndarray) -> np.ndarray:
    return bits.astype(np.uint32).view(np.float32)


def _positive_floats(seed: int) -> np.ndarray:
    """Positive normal float32 values across every exponent, plus the hard sqrt cases: squares
    of midpoints between neighbouring float32 values, rounded, and their neighbours."""
    rng = np.random.default_rng(seed)
    spread = _f32(rng.integers(0x00800000, 0x7F7FFFFF, N, dtype=np.int64))
    y = _f32(rng.integers(0x20000000, 0x5F000000, N, dtype=np.int64)).astype(np.float64)
    mid = (y + np.nextafter(y.astype(np.float32), np.float32(np.inf)).astype(np.float64)) / 2
    hard = (mid * mid).astype(np.float32)
    near = np.concatenate([hard, np.nextafter(hard, np.float32(0)), np.nextafter(hard, np.float32(np.inf))])
    return np.concatenate([spread, near])


def _pairs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Numerators and denominators: random, and quotients that fall near a midpoint."""
    rng = np.random.default_rng(seed)
    a = _f32(rng.integers(0x20000000, 0x5F000000, 3 * N, dtype=np.int64))
    b = _f32(rng.integers(0x20000000, 0x5F000000, 3 * N, dtype=np.int64))
    q = (a.astype(np.float64) / b.astype(np.float64)).astype(np.float32).astype(np.float64)
    up = np.nextafter(q.astype(np.float32), np.float32(np.inf)).astype(np.float64)
    a_hard = (((q + up) / 2) * b.astype(np.float64)).astype(np.float32)
    return np.concatenate([a, a_hard]), np.concatenate([b, b])


def _wrong(got: np.ndarray, want: np.ndarray) -> int:
    """float32 results whose bits differ from the correctly rounded ones."""
    return int(np.count_nonzero(got.view(np.uint32) != want.view(np.uint32)))


def _sqrt_reference(x: np.ndarray) -> np.ndarray:
    return np.sqrt(x.astype(np.float64)).astype(np.float32)


def _bf16_reference(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16, round to nearest even, by integer arithmetic on the bits."""
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def _ops() -> dict[str, Callable[[], tuple[int, int]]]:
    x = _positive_floats(1)
    a, b = _pairs(2)
    rng = np.random.default_rng(3)
    wide = rng.standard_normal(3 * N) * np.exp(rng.uniform(-20, 20, 3 * N))
    ratio = (a.astype(np.float64) / b.astype(np.float64)).astype(np.float32)
    recip = (1.0 / b.astype(np.float64)).astype(np.float32)
    halves = wide.astype(np.float32)

    def torch_sqrt() -> tuple[int, int]:
        return _wrong(torch.sqrt(torch.from_numpy(x)).numpy(), _sqrt_reference(x)), len(x)

    def torch_div() -> tuple[int, int]:
        return _wrong((torch.from_numpy(a) / torch.from_numpy(b)).numpy(), ratio), len(a)

    def torch_reciprocal() -> tuple[int, int]:
        return _wrong(torch.reciprocal(torch.from_numpy(b)).numpy(), recip), len(b)

    def torch_f64_to_f32() -> tuple[int, int]:
        return _wrong(torch.from_numpy(wide).float().numpy(), wide.astype(np.float32)), len(wide)

    def torch_f32_to_bf16() -> tuple[int, int]:
        got = torch.from_numpy(halves).bfloat16().view(torch.int16).numpy().view(np.uint16)
        return int(np.count_nonzero(got != _bf16_reference(halves))), len(halves)

    def torch_f32_to_f16() -> tuple[int, int]:
        got = torch.from_numpy(halves).half().numpy()
        want = halves.astype(np.float64).astype(np.float16)  # one rounding, from the exact value
        return int(np.count_nonzero(got.view(np.uint16) != want.view(np.uint16))), len(halves)

    def numpy_sqrt() -> tuple[int, int]:
        return _wrong(np.sqrt(x), _sqrt_reference(x)), len(x)

    def numpy_divide() -> tuple[int, int]:
        return _wrong(np.divide(a, b), ratio), len(a)

    return {
        "torch.sqrt f32 (the default AdamW's)": torch_sqrt,
        "torch.div f32": torch_div,
        "torch.reciprocal f32": torch_reciprocal,
        "float64 -> float32": torch_f64_to_f32,
        "float32 -> bfloat16": torch_f32_to_bf16,
        "float32 -> float16": torch_f32_to_f16,
        "numpy.sqrt f32": numpy_sqrt,
        "numpy.divide f32": numpy_divide,
    }


def check() -> dict[str, tuple[int, int]]:
    """{op: (results not correctly rounded, inputs)}: (0, n) is an exact op on this machine."""
    with np.errstate(all="ignore"):
        return {name: op() for name, op in _ops().items()}
