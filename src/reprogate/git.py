"""The few git questions reprogate asks, through the `git` command a user has.

Production is what is committed: `committed()` reads a file as HEAD holds it, which is what
`predict` and `serve` answer with whenever the project is a git repository.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from reprogate.errors import UserError

# reprogate's own state inside the git folder: never in the working tree, never committed.
STATE = Path("reprogate")
PROMOTION_JOURNAL = STATE / "promotion.json"
PROMOTE_LOCK = STATE / "promote.flock"


def completed(root: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, input=stdin)
    except FileNotFoundError:
        raise UserError(
            "git is not installed (or not on PATH); promotion is a git commit: install git."
        ) from None


def run(root: Path, *args: str, check: bool = True, stdin: str | None = None) -> str:
    proc = completed(root, *args, stdin=stdin)
    if check and proc.returncode != 0:
        raise UserError(f"git {' '.join(args)} failed in {root}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout.strip()


def git_dir(root: Path) -> Path | None:
    """The repository's git folder, or None when `root` is not in a git work tree (a deployed
    copy of the project) or git is missing."""
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "--absolute-git-dir"], cwd=root, capture_output=True, text=True
        )
    except FileNotFoundError:
        return None
    return Path(proc.stdout.strip()) if proc.returncode == 0 else None


def committed(root: Path, path: Path, rev: str = "HEAD") -> bytes | None:
    """`path` (relative to `root`) as commit `rev` holds it; None if that commit lacks it."""
    proc = subprocess.run(["git", "show", f"{rev}:./{path.as_posix()}"], cwd=root, capture_output=True)
    return proc.stdout if proc.returncode == 0 else None


def head(root: Path) -> str | None:
    proc = subprocess.run(
        ["git", "rev-parse", "-q", "--verify", "HEAD"], cwd=root, capture_output=True, text=True
    )
    return proc.stdout.strip() if proc.returncode == 0 else None
