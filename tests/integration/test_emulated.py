"""The real pipeline as another vendor's CPU computes it: a small classifier trained, calibrated
and evaluated, and a few language-model updates, natively and under QEMU presenting an Intel
CPU (`-cpu Haswell-v4`), from the same inputs. Every file is compared bit for bit: weights,
optimizer state, calibration, predictions. (This machine is an AMD: the emulated side is the
other vendor, and its IEEE-exact instructions are computed exactly.)"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reprogate.pipeline import emulate
from tests.conftest import BIN, REPO, TINY_GPT, TINY_TEXT, make_home_project, run_cli, write_model_spec

pytestmark = pytest.mark.long

INTEL = emulate.CPUS["GenuineIntel"]
FIXTURE = REPO / "tests" / "fixtures" / "lm" / "corpus.txt"


@pytest.fixture(scope="module")
def qemu() -> str:
    found = shutil.which(emulate.QEMU)
    if found is None:
        if os.environ.get(emulate.REQUIRE):
            pytest.fail(f"{emulate.QEMU} is missing and {emulate.REQUIRE} is set: run `make qemu`")
        pytest.skip(f"{emulate.QEMU} is not installed (`make qemu`)")
    return found


def _emulated(qemu: str, root: Path, *args: str) -> None:
    cmd = [qemu, "-cpu", INTEL, sys.executable, "-m", "reprogate", *args]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


def _digests(root: Path, *folders: str) -> dict[str, str]:
    out = {}
    for folder in folders:
        for f in sorted((root / folder).rglob("*")):
            if f.is_file():
                out[str(f.relative_to(root))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def test_a_classifier_trains_calibrates_and_evaluates_to_the_same_bits_as_an_emulated_intel(qemu, tmp_path):
    spec = {"steps": 12, "checkpoint": {"every_steps": 4, "keep": 3}}
    roots = {}
    for side in ("native", "intel"):
        root = make_home_project(tmp_path / side)
        write_model_spec(
            root, "tiny", {**yaml.safe_load((root / "specs/models/tiny.yaml").read_text()), **spec}
        )
        roots[side] = root
    for stage in ("train", "calibrate", "evaluate"):
        run_cli("stage", stage, "tiny", cwd=roots["native"], check=True)
        _emulated(qemu, roots["intel"], "stage", stage, "tiny")
    folders = ("models/tiny", "runs/tiny/checkpoints", "predictions/tiny", "results/tiny")
    native, intel = (_digests(roots[s], *folders) for s in ("native", "intel"))
    assert any(k.endswith("model.safetensors") for k in native) and any("checkpoints" in k for k in native)
    assert native.keys() == intel.keys()
    differ = sorted(k for k in native if native[k] != intel[k] and not k.endswith(("fingerprint.json",)))
    assert not differ, f"these files differ between native and emulated Intel: {differ}"


def test_a_language_model_updates_to_the_same_bits_as_an_emulated_intel(qemu, tmp_path):
    lm = tmp_path / "native"
    shutil.copytree(REPO / "lm" / "specs", lm / "specs")
    shutil.copy(REPO / "lm" / "params.yaml", lm / "params.yaml")
    shutil.copytree(FIXTURE.parent, lm / "raw")
    (lm / "specs/data/tiny.yaml").write_text(yaml.safe_dump(TINY_TEXT, sort_keys=False))
    gpt = {k: v for k, v in TINY_GPT.items() if k != "budget"} | {"steps": 6}
    gpt["checkpoint"] = {"every_steps": 3, "keep": 2}
    (lm / "specs/models/gpt.yaml").write_text(yaml.safe_dump(gpt, sort_keys=False))
    params = yaml.safe_load((lm / "params.yaml").read_text())
    (lm / "params.yaml").write_text(yaml.safe_dump(dict(params, data="specs/data/tiny.yaml", models=["gpt"])))
    for stage in (("corpus",), ("tokenize", "gpt")):  # the shared inputs, made once
        run_cli("stage", *stage, cwd=lm, check=True)
    intel = tmp_path / "intel"
    shutil.copytree(lm, intel)
    run_cli("stage", "train", "gpt", cwd=lm, check=True)
    _emulated(qemu, intel, "stage", "train", "gpt")
    folders = ("models/gpt", "runs/gpt/checkpoints")
    native, emulated = _digests(lm, *folders), _digests(intel, *folders)
    assert any(k.endswith("model.safetensors") for k in native) and native.keys() == emulated.keys()
    differ = sorted(k for k in native if native[k] != emulated[k] and not k.endswith("fingerprint.json"))
    assert not differ, f"these files differ between native and emulated Intel: {differ}"


def test_doctor_emulate_names_the_missing_emulator(tmp_path):
    # Without QEMU on PATH, --emulate names the make target that installs it, before any probing.
    env = {"PATH": str(tmp_path)}
    proc = run_cli("doctor", "--emulate", env=env)
    assert proc.returncode != 0 and "make qemu" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
