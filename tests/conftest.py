from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "datasets"
BIN = Path(sys.executable).parent


def run_cli(*args: str, cwd: Path = REPO, env: dict | None = None, check: bool = False):
    """Run the installed `reprogate` command as a user would (separate process)."""
    full_env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {})}
    proc = subprocess.run(
        [str(BIN / "reprogate"), *args], cwd=cwd, env=full_env, capture_output=True, text=True
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"reprogate {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def mirror() -> Path:
    if not (SHARED / "SHA256SUMS").is_file():
        pytest.fail(f"the dataset mirror {SHARED} is missing; CI lays ../shared beside the repo")
    return SHARED


def copy_project(dest: Path) -> Path:
    """A copy of the working tree as a fresh clone would have it (tracked + untracked files,
    minus git-ignored ones), with its own git repository."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for f in filter(None, files):
        src = REPO / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=dest, check=True)
    subprocess.run([*git, "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-qm", "copy"], cwd=dest, check=True)
    return dest


TINY_NGRAM = {
    "kind": "model",
    "data": "specs/data/home.yaml",
    "family": "ngram",
    "ngram": {"buckets": 4096, "dim": 16, "dropout": 0.1},
    "device": "cpu",
    "threads": 1,
    "seed": 3,
    "micro_batch": 8,
    "grad_accum": 2,
    "steps": 12,
    "optimizer": {"lr": 0.05},
    "schedule": {"kind": "cosine", "warmup_fraction": 0.2},
    "label_smoothing": 0.05,
    "checkpoint": {"every_steps": 3, "keep": 3},
    "resume_check": {"steps": 8, "checkpoint_every": 2, "kill_after": 5},
}


def make_home_project(root: Path) -> Path:
    """A small project of its own: the home-assistant fixture data, pinned and prepared."""

    from reprogate.stages.prepare import prepare

    shutil.copytree(REPO / "tests" / "fixtures" / "home", root / "raw")
    (root / "params.yaml").write_text(
        "data: specs/data/home.yaml\nmodels: [tiny]\ngate: specs/gate.yaml\nmirror: []\n"
    )
    (root / "specs" / "data").mkdir(parents=True)
    (root / "specs" / "models").mkdir(parents=True)
    spec = (REPO / "tests" / "specs_examples" / "good" / "home_local.yaml").read_text()
    (root / "specs" / "data" / "home.yaml").write_text(spec.replace("tests/fixtures/home", "raw"))
    (root / "specs" / "gate.yaml").write_text("kind: gate\n")
    write_model_spec(root, "tiny", TINY_NGRAM)
    prepare(root / "specs" / "data" / "home.yaml", root)
    return root


def write_model_spec(root: Path, name: str, spec: dict) -> Path:
    import yaml

    path = root / "specs" / "models" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
