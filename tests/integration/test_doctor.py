"""`reprogate doctor`: this machine's numeric fingerprint under the pin, against the committed one.

Nothing here assumes which CPU runs it: the reference is written on this machine first (what the
machine that made a commit does), then damaged the way another CPU would differ, one op at a time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reprogate.pipeline.doctor import established
from reprogate.records.numerics import NumericReference
from tests.conftest import REPO, copy_project

REFERENCE = Path("numerics/x86-64-v3-portable.json")


def _doctor(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reprogate", "doctor", *args], cwd=root, capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = copy_project(tmp_path_factory.mktemp("doctor"))
    (root / REFERENCE).unlink(missing_ok=True)
    missing = _doctor(root)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "does not exist" in missing.stderr and "reprogate doctor --write" in missing.stderr
    wrote = _doctor(root, "--write")
    assert wrote.returncode == 0, wrote.stderr[-2000:]
    return root


def _edit(root: Path, change) -> None:
    raw = json.loads((root / REFERENCE).read_text())
    change(raw)
    (root / REFERENCE).write_text(json.dumps(raw))


def test_the_same_machine_computes_its_own_reference(project):
    ref = NumericReference.model_validate_json((project / REFERENCE).read_text())
    (machine,) = ref.machines.values()
    classes = {"gemm", "elementwise", "reduction", "attention", "optimizer", "training", "numpy"}
    assert classes <= set(machine.ops)
    assert ref.pin["MKL_CBWR"] == "COMPATIBLE" and "unset:MKL_ENABLE_INSTRUCTIONS" in ref.pin
    said = _doctor(project)
    assert said.returncode == 0, said.stdout + said.stderr[-2000:]
    assert "every op equal to the reference" in said.stdout


def test_an_op_that_differs_is_named_with_its_class_and_fails_once_established(project):
    original = (project / REFERENCE).read_text()
    try:

        def other_vendor(raw):
            (name,) = raw["machines"]
            other = json.loads(json.dumps(raw["machines"][name]))
            other["vendor"] = "OtherVendor"
            other["ops"]["gemm"]["mm_256x384x77"] = "0" * 16
            raw["machines"]["OtherVendor CPU"] = other

        _edit(project, other_vendor)
        said = _doctor(project, "--ci")
        assert "DIFFERS: mm_256x384x77" in said.stdout and "MKL's sgemm" in said.stdout
        # Two vendors that disagree establish nothing: reported, not failed, under --ci...
        assert said.returncode == 0 and "not yet established" in said.stdout
        assert _doctor(project).returncode == 1  # ...and a person asking is told with exit 1

        def agree(raw):
            mine = next(m for m in raw["machines"].values() if m["vendor"] != "OtherVendor")
            other = raw["machines"]["OtherVendor CPU"]
            other["ops"] = json.loads(json.dumps(mine["ops"]))
            for m in raw["machines"].values():
                m["ops"]["reduction"]["softmax"] = "1" * 16  # both vendors agree; this machine not

        _edit(project, agree)
        assert established(NumericReference.model_validate_json((project / REFERENCE).read_text()))
        said = _doctor(project, "--ci")
        assert said.returncode == 1 and "DIFFERS: softmax" in said.stdout
    finally:
        (project / REFERENCE).write_text(original)


def test_a_reference_of_another_pin_or_library_build_is_refused_with_the_fix(project):
    original = (project / REFERENCE).read_text()
    try:
        _edit(project, lambda raw: raw["versions"].update(torch="1.0.0"))
        said = _doctor(project)
        assert said.returncode == 2 and "field 'versions'" in said.stderr and "make venv" in said.stderr
        _edit(project, lambda raw: raw["pin"].update(MKL_CBWR="AVX2"))
        said = _doctor(project)
        assert said.returncode == 2 and "field 'pin'" in said.stderr and "Traceback" not in said.stderr
    finally:
        (project / REFERENCE).write_text(original)


def test_a_reference_with_no_machine_is_refused_not_called_equal(project):
    original = (project / REFERENCE).read_text()
    try:
        _edit(project, lambda raw: raw.update(machines={}))
        said = _doctor(project, "--ci")
        assert said.returncode == 2 and "field 'machines' is empty" in said.stderr
        assert "every op equal" not in said.stdout
    finally:
        (project / REFERENCE).write_text(original)


def test_write_replaces_a_symlinked_reference_and_refuses_a_folder_leading_outside(project, tmp_path):
    original = (project / REFERENCE).read_text()
    target = tmp_path / "elsewhere.json"
    target.write_text("untouched")
    try:
        (project / REFERENCE).unlink()
        (project / REFERENCE).symlink_to(target)
        wrote = _doctor(project, "--write")
        assert wrote.returncode == 0, wrote.stderr[-2000:]
        assert target.read_text() == "untouched" and not (project / REFERENCE).is_symlink()
        assert "replaced what was there, which this pin cannot keep" in wrote.stdout, wrote.stdout
        folder = project / REFERENCE.parent
        moved = tmp_path / "numerics"
        folder.rename(moved)
        folder.symlink_to(moved)
        said = _doctor(project, "--write")
        assert said.returncode == 2 and "leads outside the project" in said.stderr
    finally:
        if (project / REFERENCE.parent).is_symlink():
            (project / REFERENCE.parent).unlink()
            (tmp_path / "numerics").rename(project / REFERENCE.parent)
        (project / REFERENCE).unlink(missing_ok=True)
        (project / REFERENCE).write_text(original)


def test_a_cpu_kind_no_fingerprint_covers_is_reported_not_failed():
    # Emulation covers both vendors' AVX2 CPUs: an Intel CPU with AVX-512 is not covered by the
    # committed reference until one records itself, so a difference there does not fail CI.
    from reprogate.pipeline.doctor import covered
    from reprogate.runtime.numerics import Cpu

    ref = NumericReference.model_validate_json((REPO / REFERENCE).read_text())
    assert established(ref)
    avx2 = frozenset({"avx2", "fma"})
    assert covered(ref, Cpu("GenuineIntel", "an AVX2 Intel", avx2))
    assert covered(ref, Cpu("AuthenticAMD", "an AVX2 AMD", avx2))
    assert not covered(ref, Cpu("GenuineIntel", "an AVX-512 Intel", avx2 | {"avx512f"}))
