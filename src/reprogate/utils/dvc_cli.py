"""The `dvc` command as promote and `reprogate remote` run it: one runner, one error shape.

DVC is driven through its command line (as a user and `make repro` drive it), never its Python
internals, so what reprogate does is exactly what a person can retype. The `dvc` next to this
Python comes first: the project's virtual environment, not another one on PATH.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from reprogate.utils import paths
from reprogate.utils.errors import UserError

LOCK = Path("dvc.lock")


def pipeline_file(part: str, name: Path = paths.DVC_YAML) -> Path:
    """A pipeline's dvc.yaml (name=LOCK: its dvc.lock), relative to the project: the default
    pipeline's at the top, the experiments' in experiments/."""
    return name if part == "default" else paths.EXPERIMENTS / name


def executable() -> str:
    here = Path(sys.executable).with_name("dvc")
    return str(here) if here.exists() else "dvc"


def call(root: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([executable(), *args], cwd=root, capture_output=True, text=True)
    except FileNotFoundError:
        raise UserError(
            "dvc is not installed (or not on PATH): run `make venv`, or use the project's .venv."
        ) from None


def run(root: Path, *args: str) -> str:
    proc = call(root, *args)
    if proc.returncode != 0:
        raise UserError(f"`dvc {' '.join(args)}` failed in {root}: {last_error(proc)}")
    return proc.stdout


def last_error(proc: subprocess.CompletedProcess) -> str:
    """DVC's own error line (it prints `ERROR: ...` last), not its whole log."""
    lines = [x.strip() for x in (proc.stderr or proc.stdout).splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("ERROR")]
    return (errors or lines or [f"exit status {proc.returncode}"])[-1]


def status(root: Path, *targets: Path) -> dict:
    """`dvc status --json`: the stages whose dependencies or outputs changed ({} when clean), of
    the given dvc.yaml files, or of every dvc.yaml in the project when none is given."""
    found = json.loads(run(root, "status", "--json", *map(str, targets)) or "{}")
    # Stage `code` is always changed by design (it checks the code's meaning each run); it is
    # out of date only when a file it writes is, and then the stages depending on it say so.
    return {k: v for k, v in found.items() if v != ["always changed"]}


def default_remote(root: Path) -> str | None:
    """The name of the project's default DVC remote, or None when none is configured."""
    proc = call(root, "remote", "default")
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def lock_stages(text: str | bytes | None) -> dict[str, Any]:
    """Stage -> its entry of a dvc.lock; yaml.YAMLError for one DVC did not write."""
    try:
        lock = yaml.safe_load(text or "") or {}
    except RecursionError:
        raise yaml.YAMLError("it nests deeper than any dvc.lock DVC writes") from None
    return lock.get("stages", {})


def lock_outputs(text: str | bytes | None) -> dict[str, str | None]:
    """Every output path of a dvc.lock with its md5 (a folder's ends in .dir)."""
    return {o["path"]: o.get("md5") for s in lock_stages(text).values() for o in s.get("outs", [])}


def output_md5(path: Path) -> str | None:
    """What DVC would record for `path` (a folder's ends in .dir), from the bytes themselves."""
    from dvc_data.hashfile.build import build
    from dvc_data.hashfile.db import HashFileDB
    from dvc_objects.fs.local import LocalFileSystem

    if not path.exists():
        return None
    fs = LocalFileSystem()
    with tempfile.TemporaryDirectory(prefix="reprogate-hash-") as staging:
        _, _, obj = build(HashFileDB(fs, staging), str(path), fs, "md5", dry_run=True)
    return obj.hash_info.value


def tree_md5(files: dict[str, bytes]) -> str:
    """What DVC records for a folder holding `files` (relative path -> bytes), from bytes
    already read: dvc-data's own tree of each file's md5."""
    import hashlib

    from dvc_data.hashfile.hash_info import HashInfo
    from dvc_data.hashfile.tree import Tree

    tree = Tree()
    for rel, data in sorted(files.items()):
        tree.add(tuple(rel.split("/")), None, HashInfo("md5", hashlib.md5(data).hexdigest()))
    tree.digest()
    return tree.hash_info.value
