"""The few git questions reprogate asks, through the `git` command a user has.

Production is what is committed: `committed()` reads a file as HEAD holds it, which is what
`predict` and `serve` answer with whenever the project is a git repository.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from reprogate.utils.errors import UserError

# reprogate's own state inside the git folder: never in the working tree, never committed.
STATE = Path("reprogate")
PROMOTION_JOURNAL = STATE / "promotion.json"
PROMOTE_LOCK = STATE / "promote.flock"


def _call(root: Path, args: tuple[str, ...], stdin: str | None = None, text: bool = True):
    """git's CompletedProcess, or None when git is not installed."""
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=text, input=stdin)
    except FileNotFoundError:
        return None


def completed(root: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    proc = _call(root, args, stdin)
    if proc is None:
        raise UserError("git is not installed (or not on PATH); promotion is a git commit: install git.")
    return proc


def run(root: Path, *args: str, check: bool = True, stdin: str | None = None) -> str:
    proc = completed(root, *args, stdin=stdin)
    if check and proc.returncode != 0:
        raise UserError(f"git {' '.join(args)} failed in {root}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout.strip()


def git_dir(root: Path) -> Path | None:
    """The repository's git folder, or None when `root` is not in a git work tree (a deployed
    copy of the project) or git is missing."""
    proc = _call(root, ("rev-parse", "--absolute-git-dir"))
    return Path(proc.stdout.strip()) if proc is not None and proc.returncode == 0 else None


def committed(root: Path, path: Path, rev: str = "HEAD") -> bytes | None:
    """`path` (relative to `root`) as commit `rev` holds it; None if that commit lacks it."""
    proc = _call(root, ("show", f"{rev}:./{path.as_posix()}"), text=False)
    return proc.stdout if proc is not None and proc.returncode == 0 else None


def prefix(root: Path) -> str:
    """`root`'s folder inside the repository ("" at its top, "lm/" for the lm project)."""
    return run(root, "rev-parse", "--show-prefix", check=False)


def head(root: Path) -> str | None:
    return run(root, "rev-parse", "-q", "--verify", "HEAD", check=False) or None
