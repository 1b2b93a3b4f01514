"""Team workflow: a reproduction leaves nothing to commit, and clones share a real DVC remote.

Every clone here is `git clone` of a pipeline that ran and was committed (conftest's home
pipeline): no DVC cache, no outputs, no run log. `make repro` is the Makefile's own target, run
with this test session's environment (`-o` keeps make from rebuilding it in each clone).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reprogate.records import runlog
from reprogate.utils import dvc_cli
from tests.conftest import IDENTITY, REPO, copy_home, dvc_cmd, dvc_status, git_cmd, run_cli, stages_run

VENV = Path(sys.prefix)  # the virtual environment running the tests (its python may be a symlink out of it)
GIT_ID = IDENTITY


def make_repro(root: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["make", "-C", str(root), "repro", f"VENV={VENV}", "-o", f"{VENV}/.installed"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def clone(source: Path, dest: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(source), str(dest)], check=True)
    return dest


@pytest.mark.long  # docs/testing.md: `make test-long`, run by CI
def test_a_fresh_clone_reproduces_every_stage_to_the_committed_files(home_pipeline, tmp_path):
    root = clone(home_pipeline, tmp_path / "fresh")
    proc = make_repro(root)
    assert "Running stage 'train@tiny'" in proc.stdout  # no cache: everything ran here
    assert git_cmd(root, "status", "--porcelain") == ""  # dvc.lock and every metric: the same bytes
    assert dvc_status(root) == {}
    # The telemetry was moved, not deleted: a line per run, in a git-ignored log.
    entries, bad = runlog.read(root / "logs" / "train@tiny.jsonl")
    assert len(entries) == 1 and not bad and entries[0].telemetry["wall_s"] > 0
    assert entries[0].code_commit == git_cmd(root, "rev-parse", "HEAD").strip()
    assert git_cmd(root, "check-ignore", "logs/train@tiny.jsonl").strip() == "logs/train@tiny.jsonl"
    # Every stage that ran has its line (wall time and peak memory at least), none other.
    ran = set(re.findall(r"Running stage '([^']+)'", proc.stdout))
    assert {p.stem for p in (root / "logs").glob("*.jsonl")} == ran
    prepare = runlog.read(root / "logs" / "prepare.jsonl")[0][0].telemetry
    assert prepare["wall_s"] > 0 and prepare["peak_rss_gb"] > 0


@pytest.mark.long  # docs/testing.md: `make test-long`, run by CI
def test_two_clones_share_a_remote_and_the_second_runs_nothing(home_pipeline, tmp_path):
    first = copy_home(home_pipeline, tmp_path / "first")
    said = run_cli("remote", str(tmp_path / "remote"), cwd=first, check=True).stdout
    assert "is the default DVC remote" in said and (tmp_path / "remote").is_dir()
    git_cmd(first, "add", ".dvc/config")
    git_cmd(first, "commit", "-qm", "the team's DVC remote")
    done = run_cli("promote", "--push", cwd=first, env=GIT_ID, check=True).stdout
    assert "pushed this commit's outputs and run-cache to DVC remote 'shared'" in done
    assert "no git remote to push to" in done  # a copy without one: said, not an error
    version = json.loads((first / "models/production.json").read_text())["model_version"]
    # The gate compares with production: the promotion commit carries it judged again against
    # the new record, so nothing is stale and nothing reruns.
    again = make_repro(first)
    assert stages_run(again.stdout) == [], again.stdout[-2000:]
    assert git_cmd(first, "status", "--porcelain") == ""

    second = clone(first, tmp_path / "second")
    proc = make_repro(second)
    assert "restoring what DVC remote 'shared' holds" in proc.stdout
    assert stages_run(proc.stdout) == [], proc.stdout[-3000:]
    assert dvc_status(second) == {}
    assert git_cmd(second, "status", "--porcelain") == ""
    answer = json.loads(run_cli("predict", "turn on the kitchen light", cwd=second, check=True).stdout)
    assert answer["model_version"] == version


def test_a_failed_push_leaves_production_unchanged_and_the_same_command_retries(home_pipeline, tmp_path):
    root = copy_home(home_pipeline, tmp_path / "home")
    remote = tmp_path / "remote"
    run_cli("remote", str(remote), cwd=root, check=True)
    git_cmd(root, "commit", "-qam", "remote")
    remote.rmdir()
    remote.write_text("a file where the remote folder was\n")  # unwritable, even for root
    before, head = (root / "models/production.json").read_bytes(), git_cmd(root, "rev-parse", "HEAD")
    proc = run_cli("promote", "--push", cwd=root, env=GIT_ID)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "`dvc push` to remote 'shared' failed" in proc.stderr and "production is unchanged" in proc.stderr
    assert "run `reprogate promote --push` again" in proc.stderr
    assert (root / "models/production.json").read_bytes() == before
    assert git_cmd(root, "rev-parse", "HEAD") == head and git_cmd(root, "tag", "--list") == ""
    remote.unlink()
    remote.mkdir()
    assert "is in production" in run_cli("promote", "--push", cwd=root, env=GIT_ID, check=True).stdout


def test_promote_push_without_a_remote_says_how_to_configure_one(home_pipeline, tmp_path):
    root = copy_home(home_pipeline, tmp_path / "home")
    proc = run_cli("promote", "--push", cwd=root, env=GIT_ID)
    assert proc.returncode == 2 and "make remote URL=" in proc.stderr
    assert git_cmd(root, "tag", "--list") == ""


def _bare_project(tmp_path: Path, models: str = "[]") -> Path:
    """A git + DVC project with a params.yaml and nothing else: what `reprogate remote` needs."""
    root = tmp_path / "project"
    root.mkdir()
    git_cmd(root, "init", "-q")
    dvc_cmd(root, "init", "-q")
    (root / "params.yaml").write_text(f"data: specs/data/x.yaml\nmodels: {models}\ngate: specs/gate.yaml\n")
    return root


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("s3://team-bucket/dvc", "needs DVC's dvc-s3 plugin, which is not installed"),
        ("ftp://example.com/x", "'ftp://' is not a storage reprogate configures"),
        ("inside", "inside the project"),
    ],
)
def test_a_remote_reprogate_cannot_use_is_refused_by_name(tmp_path, url, said):
    root = _bare_project(tmp_path)
    proc = run_cli("remote", url, cwd=root)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and said in proc.stderr
    assert "shared" not in (root / ".dvc" / "config").read_text()


def test_the_default_remote_is_a_folder_beside_the_project(tmp_path):
    root = _bare_project(tmp_path)
    run_cli("remote", cwd=root, check=True)
    assert (tmp_path / "reprogate-remote").is_dir()
    assert f"url = {tmp_path / 'reprogate-remote'}" in (root / ".dvc" / "config").read_text()


def test_a_fresh_clone_answers_with_the_promoted_files_the_project_ships(home_pipeline, tmp_path):
    """No cache, no outputs, no kept copy, no DVC remote, another machine's float kernels would not
    matter: the promotion commit carries the model's exact files (models/shipped, a DVC remote
    inside the project), and predict restores them at the promotion's commit."""
    first = copy_home(home_pipeline, tmp_path / "first")
    # What an interrupted promote shipped but never committed does not block the next one.
    leftover = first / "models/shipped/files/md5/00/0123456789abcdef0123456789abcd"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"shipped by a promote killed before its commit\n")
    done = run_cli("promote", cwd=first, env=GIT_ID, check=True).stdout
    record = json.loads((first / "models/production.json").read_text())
    folders = sorted(p.name for p in (first / "models/.promoted" / record["model_version"]).iterdir())
    assert f"shipped the files of {', '.join(f'models/{f}' for f in folders)} in models/shipped" in done
    assert git_cmd(first, "status", "--porcelain") == ""  # all in the promotion commit
    changed = git_cmd(first, "show", "--name-only", "--format=", "HEAD").split()
    added = [f for f in changed if f.startswith("models/shipped/")]
    assert "models/production.json" in changed and added
    assert all(f.startswith("models/shipped/files/md5/") for f in added)
    assert str(leftover.relative_to(first)) in added
    # Besides: the gate judged again against the record (dvc.lock, its records and metrics).
    others = set(changed) - {"models/production.json", *added}
    assert all(f == "dvc.lock" or f.startswith(("results/", "metrics/")) for f in others), others

    fresh = clone(first, tmp_path / "fresh")
    assert not (fresh / "models" / record["model"]).exists() and not (fresh / ".dvc/cache").exists()
    proc = run_cli("predict", "turn on the kitchen light", cwd=fresh, check=True)
    assert json.loads(proc.stdout)["model_version"] == record["model_version"]
    assert f"restoring models/{record['model']} of" in proc.stderr
    kept = fresh / "models/.promoted" / record["model_version"]
    assert sorted(p.name for p in kept.iterdir()) == folders
    for path, sha in record["artifacts"].items():  # exactly the promoted bytes
        assert hashlib.sha256((kept / Path(path).relative_to("models")).read_bytes()).hexdigest() == sha
    assert git_cmd(fresh, "status", "--porcelain") == ""  # the kept copy is git-ignored

    bare = clone(first, tmp_path / "bare")
    git_cmd(bare, "rm", "-rq", "models/shipped")  # a clone whose project ships nothing
    proc = run_cli("predict", "turn on the kitchen light", cwd=bare)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "rebuild the promotion's commit bitwise" in proc.stderr and "models/shipped" in proc.stderr
    assert not (bare / "models/.promoted" / record["model_version"]).exists()  # nothing half-kept

    # A shipped store whose labels.json has two labels swapped (what the promotion's dvc.lock
    # and production.json pin is the original): refused by name and both hashes, nothing served.
    forged = clone(first, tmp_path / "forged")
    labels = f"models/{record['model']}/labels.json"
    md5 = dvc_cli.lock_outputs((forged / "dvc.lock").read_text())[labels]
    stored = forged / "models/shipped/files/md5" / md5[:2] / md5[2:]
    swapped = json.loads(stored.read_text())
    swapped[0], swapped[1] = swapped[1], swapped[0]
    stored.chmod(0o644)
    stored.write_text(json.dumps(swapped, indent=1) + "\n")
    proc = run_cli("predict", "turn on the kitchen light", cwd=forged)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    said = " ".join(proc.stderr.split())
    assert "labels.json has sha256" in said and record["artifacts"][labels] in said
    assert hashlib.sha256(stored.read_bytes()).hexdigest() in said
    assert not (forged / "models/.promoted" / record["model_version"]).exists()


def test_make_remote_passes_the_url_as_one_argument_never_to_the_shell(tmp_path):
    root = _bare_project(tmp_path, models="[x]")
    shutil.copy(REPO / "Makefile", root / "Makefile")
    url = tmp_path / "team remote; touch pwned"  # a space, and a command the shell would run
    venv = REPO / ".venv"  # the Makefile's own venv, taken as built
    proc = subprocess.run(
        ["make", "-C", str(root), "remote", f"URL={url}", f"VENV={venv}", "-o", f"{venv}/.installed"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (root / "pwned").exists() and not (tmp_path / "pwned").exists()
    assert url.is_dir() and f"url = {url}" in (root / ".dvc" / "config").read_text()


def test_promote_push_publishes_the_commit_and_its_tag_together_or_neither(home_pipeline, tmp_path):
    """A team branch that moved on (a non-fast-forward push): the tag must not land on a commit
    the branch does not have, and the message must say nothing was published."""
    bare = tmp_path / "team.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    root = copy_home(home_pipeline, tmp_path / "home")
    run_cli("remote", str(tmp_path / "dvc-remote"), cwd=root, check=True)
    git_cmd(root, "commit", "-qam", "the team's DVC remote")
    git_cmd(root, "remote", "add", "origin", str(bare))
    branch = git_cmd(root, "rev-parse", "--abbrev-ref", "HEAD").strip()
    git_cmd(root, "push", "-q", "-u", "origin", branch)
    teammate = clone(bare, tmp_path / "teammate")
    (teammate / "NOTES.md").write_text("a teammate's change\n")
    git_cmd(teammate, "add", "NOTES.md")
    subprocess.run(
        ["git", "commit", "-qm", "notes"], cwd=teammate, env={**GIT_ID, "PATH": "/usr/bin:/bin"}, check=True
    )
    git_cmd(teammate, "push", "-q", "origin", branch)
    theirs = git_cmd(bare, "rev-parse", branch).strip()

    done = run_cli("promote", "--push", cwd=root, env=GIT_ID, check=True).stdout
    assert "refused the push" in done and "nothing was published: neither the commit nor the tags" in done
    assert git_cmd(bare, "tag", "--list") == "" and git_cmd(bare, "rev-parse", branch).strip() == theirs
    stage = git_cmd(root, "tag", "--list", "*#prod#*").strip()
    version = git_cmd(root, "tag", "--list", "*@v*").strip()
    assert f"git push --atomic origin HEAD:{branch} refs/tags/{version} refs/tags/{stage}" in done

    git_cmd(teammate, "push", "-q", "-f", "origin", f"{theirs}~1:refs/heads/{branch}")  # back
    refs = (f"refs/tags/{version}", f"refs/tags/{stage}")
    git_cmd(root, "push", "-q", "--atomic", "origin", f"HEAD:{branch}", *refs)  # as said
    assert git_cmd(bare, "rev-parse", branch) == git_cmd(root, "rev-parse", "HEAD")
    assert sorted(git_cmd(bare, "tag", "--list").split()) == sorted([stage, version])
