"""Device choice, determinism, the run environment and memory readings.

`configure_mps_env` must run before torch touches MPS: PyTorch reads the watermark
variables once, when its MPS allocator starts.
"""

from __future__ import annotations

import os
import platform
import random
import sys
from importlib import metadata
from pathlib import Path

import numpy as np

from reprogate.runtime import numerics
from reprogate.specs.model import ModelSpec
from reprogate.utils.errors import UserError

PACKAGES = ("torch", "numpy", "transformers", "peft", "safetensors", "reprogate")
DEVICES = ("auto", "cpu", "cuda", "mps")
SERVE_DEVICE_FIX = "Use --device cpu, or --device auto (the default) to take the best device present."
# Where calibrate, combine and evaluate score a trained model, when not on its training device.
SCORE_DEVICE_ENV = "REPROGATE_SCORE_DEVICE"


def configure_mps_env(spec: ModelSpec) -> None:
    os.environ["PYTORCH_MPS_HIGH_WATERMARK_RATIO"] = repr(spec.mps.high_watermark_ratio)
    os.environ["PYTORCH_MPS_LOW_WATERMARK_RATIO"] = repr(spec.mps.low_watermark_ratio)
    # cuBLAS needs this for deterministic matmuls; harmless elsewhere.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def select_device(spec: ModelSpec, spec_path: Path | str):
    device = resolve_device(
        spec.device,
        f"{spec_path}: field 'device'",
        "Use device: cpu, or device: auto to take the best device present.",
    )
    if spec.precision == "fp16" and device.type != "cuda":
        raise UserError(
            f"{spec_path}: field 'precision' is 'fp16', which needs CUDA, but the device is "
            f"'{device.type}'. Use fp32 or bf16."
        )
    return device


def scoring_device(spec: ModelSpec, spec_path: Path | str):
    """The device calibrate, combine and evaluate score a trained model on: its spec's, unless
    REPROGATE_SCORE_DEVICE names another. A model trained on a GPU host can then be rescored
    on a CPU-only one (after a gate or data change) without being retrained; training and the
    resume check always use the spec's device, and evaluate records the device it used."""
    want = os.environ.get(SCORE_DEVICE_ENV)
    if want:
        if want not in DEVICES:
            raise UserError(f"{SCORE_DEVICE_ENV} is {want!r}; use one of {', '.join(DEVICES)}, or unset it.")
        return resolve_device(want, SCORE_DEVICE_ENV, f"Give another device, or unset {SCORE_DEVICE_ENV}.")
    return resolve_device(
        spec.device,
        f"{spec_path}: field 'device'",
        f"To score this trained model on this machine without retraining it, run with "
        f"{SCORE_DEVICE_ENV}=cpu (or auto), e.g. `{SCORE_DEVICE_ENV}=cpu dvc repro`; training stages "
        "still need the spec's device.",
    )


def resolve_device(want: str, what: str, fix: str):
    """`want` (auto|cpu|cuda|mps) as a torch device; `what` names where it was asked for."""
    import torch

    has_cuda = torch.cuda.is_available()
    has_mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if want == "auto":
        want = "cuda" if has_cuda else "mps" if has_mps else "cpu"
    if want == "cuda" and not has_cuda:
        raise UserError(
            f"{what} is 'cuda', but this machine has no usable CUDA device "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none'}). {fix}"
        )
    if want == "mps" and not has_mps:
        raise UserError(
            f"{what} is 'mps', but Apple MPS is not available here "
            f"({platform.system()} {platform.machine()}, torch {torch.__version__}). {fix}"
        )
    return torch.device(want)


def seed_everything(seed: int, threads: int, device) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    # Bitwise reproducibility over speed: error out rather than run a nondeterministic kernel.
    torch.use_deterministic_algorithms(True)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def environment(device) -> dict[str, str]:
    env = {"python": sys.version.split()[0], "platform": f"{platform.system()}-{platform.machine()}"}
    for pkg in PACKAGES:
        try:
            env[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            env[pkg] = "absent"
    env["device"] = str(device)
    # The pinned numeric environment (numerics.py), never the CPU's name: a run on another CPU
    # of the same level is the same run.
    env["numerics"] = os.environ.get(numerics.PINNED_ENV, "unpinned")
    env["aten_capability"] = numerics.aten_capability()
    env["libc"] = " ".join(platform.libc_ver())
    if device.type == "cuda":
        import torch

        env["device_name"] = torch.cuda.get_device_name(device)
    return env


def device_peak_gb(device) -> float | None:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / (1 << 30)
    if device.type == "mps":
        return torch.mps.driver_allocated_memory() / (1 << 30)
    return None


def rank_and_world() -> tuple[int, int]:
    """Set by torchrun; a plain run is rank 0 of 1."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
