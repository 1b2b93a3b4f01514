"""A promotion killed at any step: production and HEAD never disagree, and the next run finishes it.

Each case kills a real `reprogate promote` at one step (a pause point it reaches, a `git` on
PATH that kills its caller, a commit hook that kills git and promote together) and checks the
invariant twice: right after the kill (what `predict` would answer is what HEAD holds, or a
refusal that says a promotion is unfinished), and after one plain rerun (the same promotion,
committed once and tagged, a clean workspace, no lock file, no journal, no temporary file).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from reprogate.predict.production import load_servable
from reprogate.utils import locks
from reprogate.utils.errors import UserError
from reprogate.utils.git import PROMOTION_JOURNAL
from tests.conftest import BIN, IDENTITY, copy_home, git_cmd, run_cli

# A real promote killed at every step: minutes of one worker (`make test-long`, run by CI).
pytestmark = pytest.mark.long

PAUSES = [
    "promote:planned",
    "promote:copy",
    "promote:journal",
    "promote:record:half",
    "promote:record:synced",
    "promote:written",
    "promote:regated",
    "promote:committed",
    "promote:tagged",
]
WRAPPED = [
    "add",
    "tag",
    "tag:after",
]  # the git wrapper kills promote before `git add`, before / after `git tag`
HOOKS = ["pre-commit", "post-commit"]  # inside `git commit`: before the commit exists, and after

WRAPPER = """#!/bin/sh
# A git that kills `reprogate promote`, its caller, at one step named by $KILL_AT.
case "$1 $2" in
  "add --") [ "$KILL_AT" = add ] && kill -9 $PPID && exit 137 ;;
  "tag -a") [ "$KILL_AT" = tag ] && kill -9 $PPID && exit 137 ;;
esac
"$REAL_GIT" "$@"
rc=$?
[ "$1 $2" = "tag -a" ] && [ "$KILL_AT" = tag:after ] && kill -9 $PPID
exit $rc
"""
# Run by git inside `git commit`: kills git (its parent) and promote (git's parent) at once.
KILLER_HOOK = """#!/bin/sh
promote=$(awk '{print $4}' /proc/$PPID/stat)
kill -9 "$promote" "$PPID"
"""


def _cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, **IDENTITY, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **(extra or {})}


def _promote_paused(root: Path, where: str) -> None:
    """Start promote, wait until it stops at `where`, SIGKILL it there."""
    env = _cli_env({"REPROGATE_PAUSE_AT": where})
    proc = subprocess.Popen(
        [str(BIN / "reprogate"), "promote"],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in proc.stdout:
        if line.startswith(f"REPROGATE-PAUSED {where}"):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"promote never reached {where}: {proc.stderr.read()}"


def _promote_killed_by_git(root: Path, tmp_path: Path, step: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(WRAPPER)
    (bin_dir / "git").chmod(0o755)
    env = _cli_env({"KILL_AT": step, "REAL_GIT": shutil.which("git")})
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(
        [str(BIN / "reprogate"), "promote"], cwd=root, env=env, capture_output=True, text=True
    )
    assert proc.returncode == -signal.SIGKILL, f"git never killed promote at {step}: {proc.stderr}"


def _promote_killed_in_commit(root: Path, hook: str) -> None:
    path = root / ".git" / "hooks" / hook
    path.write_text(KILLER_HOOK)
    path.chmod(0o755)
    try:
        proc = subprocess.run(
            [str(BIN / "reprogate"), "promote"], cwd=root, env=_cli_env(), capture_output=True
        )
    finally:
        path.unlink()
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def _head_record(root: Path) -> dict:
    return json.loads(git_cmd(root, "show", "HEAD:models/production.json"))


def _answers_as_head_holds(root: Path) -> None:
    """What predict and serve would answer: HEAD's model, or a refusal that says why."""
    head = _head_record(root)
    try:
        loaded = load_servable(root)
    except UserError as e:
        assert head.get("model") is None or "promotion was interrupted" in str(e), str(e)
        if head.get("model") is None:
            assert "no model in production yet" in str(e) or "promotion was interrupted" in str(e), str(e)
        return
    assert loaded.version == head["model_version"]


def _finished_once(root: Path, chosen: str, then_again: bool = False) -> None:
    rerun = run_cli("promote", cwd=root, env=IDENTITY)
    assert rerun.returncode == 0 and "Traceback" not in rerun.stderr, rerun.stdout + rerun.stderr
    assert f"{chosen} is in production" in rerun.stdout
    head = _head_record(root)
    assert head["model"] == chosen
    subjects = git_cmd(root, "log", "--format=%s", "--", "models/production.json").splitlines()
    assert sum(s.startswith("promote ") for s in subjects) == 1, subjects
    tag = f"{chosen}#prod#1"
    assert (
        git_cmd(root, "rev-parse", f"{tag}^{{commit}}").strip() == git_cmd(root, "rev-parse", "HEAD").strip()
    )
    assert git_cmd(root, "status", "--porcelain").strip() == ""
    assert locks.git_locks(root / ".git") == [] and not (root / ".git" / PROMOTION_JOURNAL).exists()
    assert not list((root / "models").glob(".*.tmp-*")) and not list(
        (root / "models" / ".promoted").glob(".*.tmp-*")
    )
    assert load_servable(root).version == head["model_version"]
    if not then_again:
        return
    # Once more: nothing is promoted twice. The promotion commit carries the gate judged again
    # against the new record, which chose the model production now holds: nothing to do.
    head_commit = git_cmd(root, "rev-parse", "HEAD")
    again = run_cli("promote", cwd=root, env=IDENTITY)
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout + again.stderr
    assert git_cmd(root, "rev-parse", "HEAD") == head_commit
    assert git_cmd(root, "tag", "--list", "*#prod#*").split() == [tag]


@pytest.fixture
def fresh(home_pipeline, tmp_path) -> tuple[Path, str]:
    root = copy_home(home_pipeline, tmp_path / "home")
    return root, json.loads((root / "metrics" / "gate.json").read_text())["chosen"]


@pytest.mark.parametrize("where", PAUSES)
def test_a_promote_killed_at_any_step_of_its_own_is_finished_by_the_next(fresh, where):
    root, chosen = fresh
    _promote_paused(root, where)
    _answers_as_head_holds(root)
    _finished_once(root, chosen)


@pytest.mark.parametrize("step", WRAPPED)
def test_a_promote_killed_around_git_add_and_git_tag_is_finished_by_the_next(fresh, tmp_path, step):
    root, chosen = fresh
    _promote_killed_by_git(root, tmp_path, step)
    _answers_as_head_holds(root)
    _finished_once(root, chosen)


@pytest.mark.parametrize("hook", HOOKS)
def test_a_promote_killed_inside_git_commit_leaves_locks_the_next_run_clears(fresh, hook):
    root, chosen = fresh
    _promote_killed_in_commit(root, hook)
    if hook == "pre-commit":  # git died holding the index: its lock stays behind
        assert (root / ".git" / "index.lock").exists()
    _answers_as_head_holds(root)
    _finished_once(root, chosen, then_again=hook == "post-commit")


def test_a_write_fault_in_the_record_leaves_production_as_committed(fresh, monkeypatch):
    from reprogate.promote import promotion as promote
    from reprogate.utils import atomic

    root, chosen = fresh
    before = (root / "models" / "production.json").read_bytes()
    real_replace = os.replace

    def full_disk(src, dst):
        if Path(dst).name == "production.json":
            raise OSError(28, "No space left on device", str(dst))
        return real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        promote.promote(root)
    monkeypatch.undo()
    assert (root / "models" / "production.json").read_bytes() == before
    assert not list((root / "models").glob(".*.tmp-*"))
    _answers_as_head_holds(root)
    _finished_once(root, chosen)


def test_a_git_lock_held_by_a_live_git_is_named_and_left_alone(fresh):
    root, chosen = fresh
    # `git commit -a` waiting on its editor holds .git/index.lock for as long as the editor runs.
    (root / "notes.txt").write_text("a change someone is committing\n")
    git_cmd(root, "add", "notes.txt")
    env = {**os.environ, **IDENTITY, "GIT_EDITOR": "sleep 60; :"}
    editor = subprocess.Popen(["git", "commit", "-a"], cwd=root, env=env, start_new_session=True)
    lock = root / ".git" / "index.lock"
    try:
        deadline = time.monotonic() + 30
        while not lock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        refused = run_cli("promote", cwd=root, env=IDENTITY)
        assert refused.returncode == 2 and "index.lock is held: a git process is working" in refused.stderr
        assert f"pid {editor.pid}" in refused.stderr and lock.exists()
    finally:
        os.killpg(editor.pid, signal.SIGKILL)  # git and its editor: the lock's owner is gone
        editor.wait()
    stale = run_cli("promote", cwd=root, env=IDENTITY)
    assert "removed .git/index.lock, left by a git or DVC process that is gone" in stale.stdout
    assert stale.returncode == 2 and "uncommitted changes" in stale.stderr and not lock.exists()
    git_cmd(root, "reset", "-q", "--", "notes.txt")
    (root / "notes.txt").unlink()
    _finished_once(root, chosen)


def test_a_dvc_rwlock_left_half_written_is_recognised_and_cleared(fresh):
    root, chosen = fresh
    rwlock = root / ".dvc" / "tmp" / "rwlock"
    rwlock.parent.mkdir(parents=True, exist_ok=True)
    rwlock.write_text('{"read": {"metrics/gate.json": [{"pid": 4')  # DVC killed inside json.dump
    stuck = subprocess.run([str(BIN / "dvc"), "status"], cwd=root, capture_output=True, text=True)
    assert stuck.returncode != 0 and "rwlock" in stuck.stderr.lower()  # what every promote met before
    done = run_cli("promote", cwd=root, env=IDENTITY, check=True)
    assert "removed .dvc/tmp/rwlock, left by a git or DVC process that is gone" in done.stdout
    assert f"{chosen} is in production" in done.stdout
    json.loads(rwlock.read_text())  # DVC wrote a whole one again
