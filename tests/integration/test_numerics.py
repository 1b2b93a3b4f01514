"""The pinned numeric environment (numerics.py): what it sets, what it refuses, and the proof
that it makes a run's bits independent of the CPU's own code paths.

Another CPU is played on this one the way the math libraries see an older CPU (x86-64-v2, no
AVX): ATen's capability `default` (honoured on Intel and AMD alike) and MKL's instruction cap.
Unpinned (`cpu_level: native`), the same training run on the two "machines" ends in other
weights and optimizer state; pinned (x86-64-v3), byte for byte the same. A second vendor cannot be
played by variables (MKL takes its own paths on AMD whatever they say): tests/unit/test_doctor.py
covers the fingerprint check that compares a real one with the committed reference.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reprogate.runtime import numerics
from reprogate.specs.params import Numerics
from reprogate.utils.errors import UserError
from tests.conftest import (
    OLDER_CPU,
    REPO,
    TINY_NGRAM,
    as_another_machine,
    make_home_project,
    write_model_spec,
)

STAGES = ("features", "train", "calibrate", "evaluate")


def _outputs(root: Path) -> dict[str, str]:
    """sha256 of every file a user or the gate reads of the run, plus the optimizer state."""
    files = [root / "models/tiny/model.safetensors", root / "results/tiny/eval.json"]
    files += sorted((root / "predictions/tiny").glob("*.jsonl"))
    files += sorted((root / "runs/tiny").rglob("optimizer*"))
    assert len(files) > 4 and all(f.is_file() for f in files), files
    return {str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def _run(tmp: Path, level: str, machine: dict[str, str]) -> dict[str, str]:
    root = make_home_project(tmp)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["numerics"] = {"cpu_level": level}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    write_model_spec(root, "tiny", dict(TINY_NGRAM, threads=2))
    # A process as another machine starts it: nothing of this one's pin inherited.
    env = as_another_machine(machine)
    for stage in STAGES:
        proc = subprocess.run(
            [sys.executable, "-m", "reprogate", "stage", stage, "tiny"],
            cwd=root, env=env, capture_output=True, text=True,
        )  # fmt: skip
        assert proc.returncode == 0, f"{stage} ({level}, {machine}):\n{proc.stderr[-3000:]}"
    return _outputs(root)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[tuple[str, str], dict[str, str]]:
    out = {}
    for level in ("native", "x86-64-v3"):
        for name, machine in (("this", {}), ("older_cpu", OLDER_CPU)):
            out[level, name] = _run(tmp_path_factory.mktemp(f"{level}-{name}"), level, machine)
    return out


@pytest.mark.long  # four pipeline runs (docs/testing.md); doctor's per-op check stays in make test
def test_unpinned_runs_change_bits_with_the_cpu(runs):
    a, b = runs["native", "this"], runs["native", "older_cpu"]
    differ = {f for f in a if a[f] != b[f]}
    assert "models/tiny/model.safetensors" in differ and any("optimizer" in f for f in differ), differ


@pytest.mark.long  # four pipeline runs (docs/testing.md); doctor's per-op check stays in make test
def test_pinned_runs_are_bitwise_equal_across_cpus(runs):
    assert runs["x86-64-v3", "this"] == runs["x86-64-v3", "older_cpu"]


def test_the_pin_sets_each_library_and_the_thread_rules():
    env = numerics.variables(Numerics(cpu_level="x86-64-v3"))
    # The default products take MKL's one branch documented as equal on Intel and AMD, and no
    # instruction cap (one would override the branch).
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["MKL_CBWR"] == "COMPATIBLE"
    assert "MKL_ENABLE_INSTRUCTIONS" not in env
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2" and env["MKL_DYNAMIC"] == "FALSE"
    assert "X86_V4" in env["NPY_DISABLE_CPU_FEATURES"].split(",")
    level = numerics.variables(Numerics(cpu_level="x86-64-v3", gemm="level"))
    assert level["MKL_CBWR"] == "AVX2" and level["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"
    assert set(numerics.variables(Numerics(cpu_level="native"))) == set(numerics.ALWAYS)


def test_the_portable_pin_removes_an_instruction_cap_and_refuses_one_set_later(tmp_path, monkeypatch):
    root = make_home_project(tmp_path)
    for name in numerics.VARIABLES:  # so that what pin() sets is undone after the test
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX512")
    numerics.pin(root)
    assert "MKL_ENABLE_INSTRUCTIONS" not in numerics.os.environ
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX512")
    with pytest.raises(UserError) as e:
        numerics.check(root)
    assert "MKL_ENABLE_INSTRUCTIONS='AVX512'" in str(e.value) and "no MKL_ENABLE_INSTRUCTIONS" in str(e.value)


def test_a_cpu_without_the_level_is_refused(monkeypatch):
    older = numerics.Cpu("GenuineIntel", "an older CPU", frozenset({"sse4_2", "popcnt", "ssse3", "avx"}))
    monkeypatch.setattr(numerics, "cpu", lambda: older)
    with pytest.raises(UserError) as e:
        numerics.refuse_unless_honoured(Numerics(cpu_level="x86-64-v3"), "params.yaml")
    said = str(e.value)
    assert "numerics.cpu_level" in said and "x86-64-v3" in said and "lacks avx2" in said
    assert "native" in said  # the way out is named
    numerics.refuse_unless_honoured(Numerics(cpu_level="native"), "params.yaml")


@pytest.mark.parametrize("variable", numerics.UNSET_ALWAYS)
def test_a_caller_variable_that_bends_the_pin_is_removed_or_refused(monkeypatch, variable, tmp_path):
    # MKL's vendor override and thread counts other than the spec's: the pin removes them, and a
    # process that has one anyway (set after the pin) is refused, naming it.
    root = REPO
    monkeypatch.setenv(variable, "1")
    numerics.pin(root)
    assert variable not in os.environ
    monkeypatch.setenv(variable, "1")
    with pytest.raises(UserError) as e:
        numerics.check(root)
    assert variable in str(e.value)


def test_onednn_is_capped_under_both_its_names():
    env = numerics.variables(Numerics(cpu_level="x86-64-v3"))
    assert env["ONEDNN_MAX_CPU_ISA"] == env["DNNL_MAX_CPU_ISA"] == "AVX2"


def test_the_vendor_is_cpuids_not_proc_cpuinfos():
    # Under QEMU /proc/cpuinfo still names the host; CPUID names the CPU the code computes on.
    cpu = numerics.cpu()
    assert cpu.vendor in ("GenuineIntel", "AuthenticAMD") and "avx2" in cpu.flags


def test_another_architecture_is_refused(monkeypatch):
    monkeypatch.setattr(numerics.platform, "machine", lambda: "arm64")
    with pytest.raises(UserError, match="x86-64 level, but this machine is arm64"):
        numerics.refuse_unless_honoured(Numerics(cpu_level="x86-64-v4"), "params.yaml")


def test_a_stage_refuses_a_process_the_pin_did_not_reach(tmp_path, monkeypatch):
    root = make_home_project(tmp_path)
    monkeypatch.setenv("MKL_CBWR", "AVX512")  # as if MKL had loaded under another branch
    with pytest.raises(UserError) as e:
        numerics.check(root)
    assert "MKL_CBWR='AVX512'" in str(e.value) and "python -m reprogate" in str(e.value)


def test_a_bad_level_is_a_spec_error(tmp_path):
    root = make_home_project(tmp_path)
    (root / "params.yaml").write_text((root / "params.yaml").read_text() + "numerics: {cpu_level: avx3}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "reprogate", "validate", "specs/"], cwd=root, capture_output=True, text=True
    )
    assert proc.returncode == 2 and "numerics.cpu_level" in proc.stderr and "Traceback" not in proc.stderr
