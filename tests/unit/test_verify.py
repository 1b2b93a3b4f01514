"""`reprogate verify`: a rebuild's outputs against a commit's, each bitwise, within tolerance,
different or missing (hashed from the files themselves), whether the decisions held, and the exit
status that says the worst."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from reprogate.pipeline.verify import (
    DECISIONS_CHANGED,
    DECISIONS_UNCHECKED,
    OWNER,
    WORKSPACE,
    clean_leftovers,
    compare,
    verify,
)
from reprogate.utils.dvc_cli import output_md5
from reprogate.utils.errors import UserError
from tests.conftest import REPO, git_cmd

EVAL = {"acc": 0.9, "sets": {"test": {"ece": 0.0125}}, "n": 3}


def _gate(verdict: str = "fail", chosen: str | None = None) -> dict:
    rule = {"rule": "accuracy", "value": 0.9, "op": ">=", "threshold": 0.93, "verdict": verdict}
    cand = {"passed": verdict == "pass", "heldout_accuracy": 0.9, "model_version": "m@1", "rules": [rule]}
    return {"passed": chosen is not None, "chosen": chosen, "reasons": [], "candidates": {"m": cand}}


def _files(root: Path, eval_json: dict, weights: bytes, gate: dict) -> None:
    for d in ("metrics", "models/m", "results"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "metrics" / "eval.json").write_text(json.dumps(eval_json))
    (root / "models" / "m" / "model.safetensors").write_bytes(weights)
    (root / "results" / "gate.json").write_text(json.dumps(gate))
    (root / "params.yaml").write_text("data: d\nmodels: [m]\ngate: g\n")


def _lock(root: Path) -> str:
    outs = [
        {"path": p, "md5": output_md5(root / p)}
        for p in ("metrics/eval.json", "models/m", "results/gate.json")
    ]
    return yaml.safe_dump({"schema": "2.0", "stages": {"s": {"cmd": "x", "outs": outs}}})


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "repo"
    _files(root, EVAL, b"weights", _gate())
    (root / "dvc.lock").write_text(_lock(root))
    git_cmd(root, "init", "-q")
    git_cmd(root, "add", "-A")
    git_cmd(root, "commit", "-qm", "c")
    return root


def _rebuilt(
    tmp_path: Path, eval_json: dict = EVAL, weights: bytes = b"weights", gate: dict | None = None
) -> Path:
    d = tmp_path / "rebuilt"
    _files(d, eval_json, weights, gate or _gate())
    (d / "dvc.lock").write_text(_lock(d))
    return d


def test_the_same_bytes_are_bitwise_and_exit_0(repo, tmp_path):
    status, said = verify(repo, "HEAD", _rebuilt(tmp_path), 1e-6)
    assert status == 0 and "3 bitwise, 0 within tolerance, 0 different, 0 missing of 3 outputs" in said
    assert "decisions: gate verdicts and chosen candidate held" in said


def test_a_copied_dvc_lock_is_not_a_rebuild(repo, tmp_path):
    forged = tmp_path / "forged"
    forged.mkdir()
    shutil.copy(repo / "dvc.lock", forged / "dvc.lock")
    shutil.copy(repo / "params.yaml", forged / "params.yaml")
    status, said = verify(repo, "HEAD", forged, 1e-6)
    assert status == 3 and "0 bitwise" in said and "3 missing" in said
    (forged / "models" / "m").mkdir(parents=True)
    (forged / "models" / "m" / "model.safetensors").write_bytes(b"other")
    assert {v.path: v.verdict for v in compare(repo, "HEAD", forged, 1e-6)}["models/m"] == "different"


def test_a_moved_number_is_within_tolerance_with_its_field(repo, tmp_path):
    moved = {"acc": 0.9, "sets": {"test": {"ece": 0.0125 + 3e-8}}, "n": 3}
    d = _rebuilt(tmp_path, moved)
    verdicts = {v.path: v for v in compare(repo, "HEAD", d, 1e-6)}
    ev = verdicts["metrics/eval.json"]
    assert ev.verdict == "within tolerance" and "sets.test.ece" in ev.detail and "3e-08" in ev.detail
    assert verdicts["models/m"].verdict == "bitwise"
    assert verify(repo, "HEAD", d, 1e-6)[0] == 1
    assert verify(repo, "HEAD", d, 1e-9)[0] == 3  # the same move past a tighter tolerance


def test_changed_bits_with_every_decision_held_say_so(repo, tmp_path):
    d = _rebuilt(tmp_path, {"acc": 0.9, "sets": {"test": {"ece": "n/a"}}, "n": 3}, b"other weights")
    status, said = verify(repo, "HEAD", d, 1.0)
    assert status == 3 and "decisions held" in said


def test_a_gate_verdict_that_moved_is_a_changed_decision(repo, tmp_path):
    d = _rebuilt(tmp_path, gate=_gate("pass", chosen="m"))
    status, said = verify(repo, "HEAD", d, 1e-6)
    assert status == DECISIONS_CHANGED and "decisions: gate verdicts and chosen candidate CHANGED" in said
    assert "chosen: None -> m" in said and "m: accuracy: fail -> pass" in said


def test_a_bad_revision_folder_or_lock_is_one_paragraph(repo, tmp_path):
    with pytest.raises(UserError, match="'nope' is not a commit"):
        verify(repo, "nope", None, 1e-6)
    with pytest.raises(UserError, match="not a rebuilt project"):
        verify(repo, "HEAD", tmp_path, 1e-6)
    (repo / "dvc.lock").write_text("stages: [unclosed\n")
    git_cmd(repo, "commit", "-qam", "damaged lock")
    with pytest.raises(UserError, match="is not a dvc.lock DVC wrote"):
        verify(repo, "HEAD", _rebuilt(tmp_path), 1e-6)


def test_the_pr_report_says_whether_the_base_reproduced(repo, tmp_path):
    from reprogate.report.build import reproduced
    from reprogate.report.markdown import _reproduced

    moved = {"acc": 0.9, "sets": {"test": {"ece": 0.0125 + 3e-8}}, "n": 3}
    said = "\n".join(_reproduced(reproduced(repo, "HEAD", _rebuilt(tmp_path, moved))))
    assert "Rebuilt here from nothing: **within tolerance** (2 bitwise, 1 within tolerance 1e-06" in said
    assert "| metrics/eval.json | within tolerance | max difference 3e-08 in sets.test.ece" in said
    d = _rebuilt(tmp_path / "2")
    assert "**bitwise** (3 bitwise, 0 within tolerance 1e-06, 0 different, 0 missing" in "\n".join(
        _reproduced(reproduced(repo, "HEAD", d))
    )


@pytest.mark.parametrize("locked", [False, True], ids=["checked-out", "mid-checkout"])
def test_a_verify_stopped_midway_leaves_nothing_behind_after_the_next_run(repo, locked):
    """A verify killed while rebuilding (SIGKILL, a closed terminal) cannot clean up; the next
    one removes its worktree and folder and says so, and leaves a running verify's alone. Killed
    during `git worktree add`, the worktree is still locked ("initializing") as git left it."""
    stopped = Path(tempfile.mkdtemp(prefix=WORKSPACE))
    git_cmd(repo, "worktree", "add", "-q", "--detach", str(stopped / "tree"), "HEAD")
    if locked:
        git_cmd(repo, "worktree", "lock", "--reason", "initializing", str(stopped / "tree"))
    (stopped / "tree" / "cache.bin").write_bytes(b"x" * 2_000_000)
    gone = subprocess.Popen(["true"])
    gone.wait()
    (stopped / OWNER).write_text(str(gone.pid))
    running = Path(tempfile.mkdtemp(prefix=WORKSPACE))
    (running / OWNER).write_text(str(os.getpid()))
    try:
        said = clean_leftovers(repo)
        assert not stopped.exists() and running.exists()
        assert said == [f"verify: removed {stopped} (2 MB), left by a verify that was stopped"]
        assert str(stopped) not in git_cmd(repo, "worktree", "list")
    finally:
        shutil.rmtree(running)
        shutil.rmtree(stopped, ignore_errors=True)


def _commit_a_slow_stage(repo: Path, cmd: str) -> None:
    """A commit whose rebuild takes a while: a project (its entry point) with one slow stage."""
    shutil.copy(REPO / "pyproject.toml", repo / "pyproject.toml")
    (repo / "dvc.yaml").write_text(f"stages:\n  slow:\n    cmd: {cmd}\n")
    subprocess.run([str(Path(sys.executable).with_name("dvc")), "init", "-q"], cwd=repo, check=True)
    git_cmd(repo, "add", "-A")
    git_cmd(repo, "commit", "-qm", "a slow stage")


def _verify_head(repo: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("reprogate")), "verify", "HEAD"],
        cwd=repo,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigterm_during_the_rebuild_removes_the_worktree(repo):
    _commit_a_slow_stage(repo, "sleep 20")
    before = set(Path(tempfile.gettempdir()).glob(f"{WORKSPACE}*"))
    proc = _verify_head(repo)
    deadline = time.monotonic() + 60
    while not (new := set(Path(tempfile.gettempdir()).glob(f"{WORKSPACE}*")) - before):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.1)
    [folder] = new
    while not (folder / "tree").exists() and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode != 0 and not folder.exists()
    assert "Traceback" not in proc.stderr.read()
    assert str(folder) not in git_cmd(repo, "worktree", "list")


def test_sigterm_while_a_stage_runs_stops_the_stage_too(repo):
    # Stopped mid-stage, verify stops dvc and the stage's process before their folder is removed.
    pid_file = repo.parent / "stage.pid"
    _commit_a_slow_stage(repo, f"echo $$ > {pid_file} && exec sleep 60")
    proc = _verify_head(repo)
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.1)
    stage = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode != 0
    # Gone, or at most a zombie for the moment its new parent takes to reap it.
    deadline = time.monotonic() + 5
    while _alive(stage):
        assert time.monotonic() < deadline, f"the stage's process {stage} outlived verify"
        time.sleep(0.1)
    assert "Traceback" not in proc.stderr.read()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _experiments(root: Path, gate: dict, weights: bytes) -> None:
    """An experiments pipeline beside the default one: its own outputs, lock and gate."""
    for d in ("models/x", "results/experiments", "experiments"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "models" / "x" / "model.safetensors").write_bytes(weights)
    (root / "results" / "experiments" / "gate.json").write_text(json.dumps(gate))
    outs = [{"path": p, "md5": output_md5(root / p)} for p in ("models/x", "results/experiments/gate.json")]
    lock = yaml.safe_dump({"schema": "2.0", "stages": {"s": {"cmd": "x", "outs": outs}}})
    (root / "experiments" / "dvc.lock").write_text(lock)


def test_the_experiments_pipeline_is_verified_against_its_own_lock_and_gate(repo, tmp_path):
    _experiments(repo, _gate(), b"x weights")
    git_cmd(repo, "add", "-A")
    git_cmd(repo, "commit", "-qm", "experiments")
    d = _rebuilt(tmp_path)
    with pytest.raises(UserError, match=r"no experiments/dvc.lock .* run `make repro-experiments`"):
        verify(repo, "HEAD", d, 1e-6, "experiments")
    _experiments(d, _gate("pass", chosen="m"), b"other x weights")
    status, said = verify(repo, "HEAD", d, 1e-6, "experiments")
    assert "different         models/x" in said and "metrics/eval.json" not in said  # its outputs only
    assert status == DECISIONS_CHANGED and "of 2 outputs" in said
    assert "decisions: gate verdicts and chosen candidate CHANGED" in said and "chosen: None -> m" in said
    # The default pipeline's verdicts are its own: its outputs and its gate held.
    assert verify(repo, "HEAD", d, 1e-6)[0] == 0


def test_verify_rebuilds_the_experiments_with_what_they_read_of_the_default_pipeline(repo):
    """A real rebuild from nothing: experiments/dvc.yaml's stage reads an output of the default
    pipeline, which the worktree has not got either, so DVC rebuilds that one first."""
    shutil.copy(REPO / "pyproject.toml", repo / "pyproject.toml")
    (repo / "dvc.yaml").write_text("stages:\n  base:\n    cmd: echo base > base.txt\n    outs: [base.txt]\n")
    (repo / "experiments").mkdir()
    x = {"wdir": "..", "cmd": "cat base.txt base.txt > x.txt", "deps": ["base.txt"], "outs": ["x.txt"]}
    (repo / "experiments" / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"x": x}}))
    dvc = str(Path(sys.executable).with_name("dvc"))
    subprocess.run([dvc, "init", "-q"], cwd=repo, check=True)
    subprocess.run([dvc, "repro", "-q", "experiments/dvc.yaml"], cwd=repo, check=True)
    git_cmd(repo, "add", "-A")
    git_cmd(repo, "commit", "-qm", "an experiment, run")
    status, said = verify(repo, "HEAD", None, 1e-6, "experiments")
    assert "bitwise           x.txt" in said and "base.txt" not in said, said
    assert "1 bitwise, 0 within tolerance, 0 different, 0 missing of 1 outputs" in said
    # Every output reproduced, but no decision could be compared: not the exit of "all held".
    assert (
        status == DECISIONS_UNCHECKED
        and "not checked: the commit has no results/experiments/gate.json" in said
    )


def test_the_workspace_itself_through_a_link_is_not_a_rebuild(repo, tmp_path):
    # Its outputs are the commit's by construction: "bitwise, decisions held" would overstate.
    link = tmp_path / "looks-rebuilt"
    link.symlink_to(repo)
    with pytest.raises(UserError, match="this project's own workspace"):
        verify(repo, "HEAD", link, 1e-6)


def test_a_rebuild_with_no_predictions_folder_is_not_a_held_decision(repo, tmp_path):
    from reprogate.pipeline import decisions

    held = decisions.predictions(repo, "HEAD", ["predictions/m"], _rebuilt(tmp_path))
    assert held.unchecked == "the rebuild has no predictions/m"
    nothing = decisions.Held("gate verdicts and chosen candidate")
    assert "not checked: there was nothing to compare" in nothing.line()
    assert decisions.summary([nothing]) == "unchecked"


def test_the_report_refuses_a_folder_that_is_no_rebuild_and_compares_every_lock_of_its_pipeline(
    repo, tmp_path
):
    from reprogate.report.build import reproduced

    with pytest.raises(UserError, match="not a rebuilt project"):
        reproduced(repo, "HEAD", Path("/etc"))
    _experiments(repo, _gate(), b"x weights")
    git_cmd(repo, "add", "-A")
    git_cmd(repo, "commit", "-qm", "experiments")
    d = _rebuilt(tmp_path)
    _experiments(d, _gate(), b"x weights")
    shutil.rmtree(d / "models" / "x")  # an experiment output the rebuild lacks
    got = reproduced(repo, "HEAD", d, "experiments")
    assert got["counts"]["missing"] == 1 and got["counts"]["bitwise"] == 4, got["counts"]


def test_a_rebuilt_gate_record_linking_outside_is_not_read(repo, tmp_path):
    # A rebuilt folder whose results/gate.json links to /etc/passwd: one line, nothing of the
    # file quoted, never a pydantic traceback.
    d = _rebuilt(tmp_path)
    (d / "results" / "gate.json").unlink()
    (d / "results" / "gate.json").symlink_to("/etc/passwd")
    status, said = verify(repo, "HEAD", d, 1e-6)
    assert "is a link leading outside it; it was not read" in said and "root:" not in said
    (d / "results" / "gate.json").unlink()
    (d / "results" / "gate.json").write_text('{"chosen": 3}')
    status, said = verify(repo, "HEAD", d, 1e-6)
    assert "is not a gate record" in said


def test_rebuilt_predictions_linking_outside_or_not_predictions_are_named_not_read(repo, tmp_path):
    from reprogate.pipeline import decisions

    d = _rebuilt(tmp_path)
    (d / "predictions" / "m").mkdir(parents=True)
    (d / "predictions" / "m" / "test.jsonl").symlink_to("/etc/passwd")
    held = decisions.predictions(repo, "HEAD", ["predictions/m"], d)
    assert "is a link leading outside it; it was not read" in held.unchecked and "root:" not in held.unchecked
    # A line that is no prediction is named by its number: never a pydantic or recursion traceback.
    assert decisions._answers(["[" * 5000]).startswith("line 1 is not a prediction")
    assert decisions._answers(["", '{"id": "7"}']).startswith("line 2 is not a prediction (")


def test_a_folder_hashed_from_bytes_read_once_is_what_dvc_records(tmp_path):
    # folder/pins.py checks a pinned folder output on the bytes it then serves: dvc-data's tree
    # hash of those bytes must be the md5 DVC wrote in dvc.lock for the folder.
    from reprogate.folder.manifest import Files
    from reprogate.utils.dvc_cli import tree_md5

    d = tmp_path / "assets"
    (d / "tokenizer").mkdir(parents=True)
    (d / "tokenizer" / "tokenizer.json").write_text('{"a": 1}')
    (d / "members.json").write_bytes(bytes(range(256)) * 40)
    assert tree_md5(Files.read(d).data) == output_md5(d)
