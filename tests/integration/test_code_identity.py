"""Code identity by meaning, through plain `dvc repro` on a built pipeline: a comment, a
docstring line or a blank line in the modules every stage runs reruns nothing; a real change
reruns exactly the stages whose code runs it. The copy's own src/ is the package its stages
import (PYTHONPATH), as a user's edited checkout would be."""

from __future__ import annotations

import json
import os
import subprocess

from tests.conftest import BIN, copy_home, git_cmd

# A sample of the modules every stage of the three pipelines runs (issue 51's 24).
EVERY_STAGE = (
    "specs/model.py",
    "specs/loader.py",
    "specs/data.py",
    "records/base.py",
    "pipeline/context.py",
    "utils/paths.py",
    "utils/hashing.py",
    "utils/console.py",
)


def _dvc(root, *args):
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([str(BIN / "dvc"), *args], cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _edit(root, module, transform):
    f = root / "src" / "reprogate" / module
    f.write_text(transform(f.read_text()))


def test_comments_rerun_nothing_and_a_real_change_reruns_its_stages(home_pipeline, tmp_path):
    root = copy_home(home_pipeline, tmp_path / "p")
    lock = (root / "dvc.lock").read_text()
    for i, module in enumerate(EVERY_STAGE):
        edits = (
            lambda s: "# a comment a newcomer adds\n" + s,
            lambda s: s.replace('"""', '"""A docstring line.\n\n', 1) if s.startswith('"""') else s + "\n",
            lambda s: s.replace("\n\n\n", "\n\n\n\n", 1),
        )
        _edit(root, module, edits[i % 3])
    out = _dvc(root, "repro")
    assert "Running stage 'code'" in out
    ran = [line for line in out.splitlines() if line.startswith("Running stage") and "'code'" not in line]
    assert not ran, ran
    assert (root / "dvc.lock").read_text() == lock
    changed = git_cmd(root, "status", "--porcelain").split()
    assert not [f for f in changed if not f.startswith("src/") and len(f) > 2], changed

    # A real change: what calibration computes with. Exactly the stages whose code runs it go stale.
    _edit(root, "predict/calibration.py", lambda s: s + "\nBINS_NOTE = 15\n")
    identities = [json.loads(f.read_text()) for f in (root / "code").glob("**/*.json")]
    runs_it = {i["stage"] for i in identities if "reprogate.predict.calibration" in i["modules"]}
    assert runs_it and "prepare" not in runs_it
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    subprocess.run([str(BIN / "reprogate"), "stage", "code"], cwd=root, env=env, check=True)
    stale = json.loads(_dvc(root, "status", "--json"))
    # Stage `code` itself shows its rewritten output; every other stale stage runs the module.
    stale_stages = {name.split("@")[0] for name in stale} - {"code"}
    assert stale_stages == runs_it


def test_status_says_each_pipeline_is_up_to_date_or_what_builds_it(home_pipeline, tmp_path):
    # A newcomer's check after `make repro`: one line per pipeline, clean, though stage `code`
    # is "always changed" to plain `dvc status`; a real change names the stages and the command.
    from tests.conftest import run_cli

    root = copy_home(home_pipeline, tmp_path / "p")
    said = run_cli("status", cwd=root)
    assert said.returncode == 0 and "default pipeline (dvc.yaml): up to date" in said.stdout, said.stdout
    _edit(root, "predict/calibration.py", lambda s: s + "\nBINS_NOTE = 15\n")
    env = {"PYTHONPATH": str(root / "src")}
    said = run_cli("status", cwd=root, env=env)
    assert said.returncode == 1 and "stage(s) out of date (" in said.stdout
    assert "calibrate@tiny (its code)" in said.stdout and "`make repro` builds them" in said.stdout
    assert "not built here" not in said.stdout  # every output is here: what changed is the code


def test_status_tells_a_fresh_clone_apart_from_a_changed_workspace(home_pipeline, tmp_path):
    # A fresh clone has no outputs and no cache: its stages are not built here, and nothing is
    # out of date, since the lock describes them as committed. A changed spec is out of date.
    from tests.conftest import run_cli

    fresh = tmp_path / "fresh"
    subprocess.run(["git", "clone", "-q", str(home_pipeline), str(fresh)], check=True)
    said = run_cli("status", cwd=fresh)
    assert said.returncode == 1, said.stdout + said.stderr
    assert (
        "stage(s) not built here, inputs as committed (" in said.stdout and "out of date" not in said.stdout
    )
    spec = fresh / "specs/models/tiny.yaml"
    spec.write_text(spec.read_text().replace("seed: 3", "seed: 5"))
    said = run_cli("status", cwd=fresh)
    assert said.returncode == 1 and "2 stage(s) out of date (resume_check@tiny, train@tiny)" in said.stdout
    assert "not built here, inputs as committed (calibrate@duo" in said.stdout, said.stdout
