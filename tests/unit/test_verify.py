"""`reprogate verify`: a rebuild's outputs against a commit's, each bitwise, within tolerance or
different, and the exit status that says the worst."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from reprogate.pipeline.verify import compare, verify
from reprogate.utils.errors import UserError
from tests.conftest import git_cmd


def _lock(outs: dict[str, str]) -> str:
    return yaml.safe_dump(
        {
            "schema": "2.0",
            "stages": {"s": {"cmd": "x", "outs": [{"path": p, "md5": m} for p, m in outs.items()]}},
        }
    )


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "repo"
    (root / "metrics").mkdir(parents=True)
    (root / "params.yaml").write_text("data: d\nmodels: [m]\ngate: g\n")
    (root / "metrics" / "eval.json").write_text(
        json.dumps({"acc": 0.9, "sets": {"test": {"ece": 0.0125}}, "n": 3})
    )
    (root / "dvc.lock").write_text(_lock({"metrics/eval.json": "aaa", "models/m": "bbb.dir"}))
    git_cmd(root, "init", "-q")
    git_cmd(root, "add", "-A")
    git_cmd(root, "commit", "-qm", "c")
    return root


def _rebuilt(tmp_path: Path, outs: dict[str, str], eval_json: dict | None) -> Path:
    d = tmp_path / "rebuilt"
    (d / "metrics").mkdir(parents=True)
    (d / "dvc.lock").write_text(_lock(outs))
    if eval_json is not None:
        (d / "metrics" / "eval.json").write_text(json.dumps(eval_json))
    return d


def test_the_same_hashes_are_bitwise_and_exit_0(repo, tmp_path):
    d = _rebuilt(tmp_path, {"metrics/eval.json": "aaa", "models/m": "bbb.dir"}, None)
    status, said = verify(repo, "HEAD", d, 1e-6)
    assert status == 0 and "2 bitwise, 0 within tolerance, 0 different of 2 outputs" in said


def test_a_moved_number_is_within_tolerance_with_its_field(repo, tmp_path):
    moved = {"acc": 0.9, "sets": {"test": {"ece": 0.0125 + 3e-8}}, "n": 3}
    d = _rebuilt(tmp_path, {"metrics/eval.json": "zzz", "models/m": "bbb.dir"}, moved)
    [ev, model] = compare(repo, "HEAD", d, 1e-6)
    assert ev.verdict == "within tolerance" and "sets.test.ece" in ev.detail and "3e-08" in ev.detail
    assert model.verdict == "bitwise"
    assert verify(repo, "HEAD", d, 1e-6)[0] == 1
    assert verify(repo, "HEAD", d, 1e-9)[0] == 3  # the same move past a tighter tolerance


def test_a_changed_binary_or_field_is_different_and_exit_3(repo, tmp_path):
    changed = {"acc": 0.9, "sets": {"test": {"ece": "n/a"}}, "n": 3}
    d = _rebuilt(tmp_path, {"metrics/eval.json": "zzz", "models/m": "ccc.dir"}, changed)
    verdicts = {v.path: v for v in compare(repo, "HEAD", d, 1e-6)}
    assert verdicts["metrics/eval.json"].verdict == "different"
    assert verdicts["models/m"].verdict == "different"
    assert verify(repo, "HEAD", d, 1.0)[0] == 3


def test_a_bad_revision_or_folder_is_one_paragraph(repo, tmp_path):
    with pytest.raises(UserError, match="'nope' is not a commit"):
        verify(repo, "nope", None, 1e-6)
    with pytest.raises(UserError, match="no dvc.lock there; run `make repro` in it first"):
        verify(repo, "HEAD", tmp_path, 1e-6)


def test_the_pr_report_says_whether_the_base_reproduced(repo, tmp_path):
    from reprogate.report.build import reproduced
    from reprogate.report.markdown import _reproduced

    moved = {"acc": 0.9, "sets": {"test": {"ece": 0.0125 + 3e-8}}, "n": 3}
    d = _rebuilt(tmp_path, {"metrics/eval.json": "zzz", "models/m": "bbb.dir"}, moved)
    said = "\n".join(_reproduced(reproduced(repo, "HEAD", d)))
    assert "Rebuilt here from nothing: **within tolerance** (1 bitwise, 1 within tolerance 1e-06" in said
    assert "| metrics/eval.json | within tolerance | max difference 3e-08 in sets.test.ece" in said
    d = _rebuilt(tmp_path / "2", {"metrics/eval.json": "aaa", "models/m": "bbb.dir"}, None)
    assert "**bitwise** (2 bitwise, 0 within tolerance 1e-06, 0 different" in "\n".join(
        _reproduced(reproduced(repo, "HEAD", d))
    )
