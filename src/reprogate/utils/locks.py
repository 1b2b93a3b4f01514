"""Lock files left behind by a git or DVC process that was killed, told apart from live ones.

Git's lock files (index.lock, HEAD.lock, refs/.../x.lock) hold no owner: git itself only says
"remove the file manually" once its creator is gone. A lock counts as stale here when no git
process is working in this repository at all; locks are listed first and processes looked up
after, so a git started in between is seen alive and nothing of it is touched. DVC's rwlock
names its owners by pid, and DVC drops dead ones itself; what it cannot read past is the file
half-written by a killed DVC, which is stale on the same rule, with DVC processes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil

from reprogate.utils.errors import UserError

DVC_RWLOCK = Path(".dvc/tmp/rwlock")


def git_locks(git_dir: Path) -> list[Path]:
    """Lock files git leaves when killed: the index, HEAD and other top-level files, and refs."""
    found = list(git_dir.glob("*.lock"))
    if (git_dir / "refs").is_dir():
        found += (git_dir / "refs").rglob("*.lock")
    return sorted(p for p in found if p.is_file())


def _is_tool(cmdline: list[str], name: str, tool: str) -> bool:
    if name == tool or (cmdline and Path(cmdline[0]).name == tool):
        return True
    # `dvc` is a Python script: python /…/bin/dvc status
    return tool == "dvc" and len(cmdline) > 1 and Path(cmdline[1]).name == "dvc"


def live(root: Path, tool: str) -> list[tuple[int, str]]:
    """(pid, command line) of every running `tool` process whose working folder is in `root`."""
    real = root.resolve()
    found = []
    for p in psutil.process_iter(["pid", "name", "cmdline", "cwd"]):
        info = p.info
        if info["pid"] == os.getpid() or not info["cwd"]:
            continue
        if _is_tool(info["cmdline"] or [], info["name"] or "", tool):
            cwd = Path(info["cwd"])
            if cwd == real or cwd.is_relative_to(real):
                found.append((info["pid"], " ".join(info["cmdline"] or [info["name"]])[:120]))
    return found


def _busy(root: Path, lock: Path, tool: str, owners: list[tuple[int, str]]) -> UserError:
    who = "; ".join(f"pid {pid}: {cmd}" for pid, cmd in owners)
    return UserError(
        f"{lock} is held: a {tool} process is working in {root} ({who}). Wait for it to finish (or "
        f"stop it), then run the command again; if none of those processes is really using the "
        f"repository, remove {lock} by hand."
    )


def _rwlock_corrupt(path: Path) -> bool:
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return False
    except (json.JSONDecodeError, UnicodeDecodeError):
        return True
    return False


def clear(root: Path, git_dir: Path | None, dry_run: bool = False) -> str:
    """Remove git lock files and a half-written DVC rwlock whose owner is gone, and say which
    ("" when none); refuse, naming the file, its owner and the fix, when a git or DVC process
    is still working here. A dry run only says what it would remove."""
    stale: list[Path] = []
    locks = git_locks(git_dir) if git_dir else []
    if locks:
        if owners := live(root, "git"):
            raise _busy(root, locks[0], "git", owners)
        stale += locks
    rwlock = root / DVC_RWLOCK
    if _rwlock_corrupt(rwlock):
        if owners := live(root, "dvc"):
            raise _busy(root, rwlock, "DVC", owners)
        stale.append(rwlock)
    if not stale:
        return ""
    if not dry_run:
        for f in stale:
            f.unlink(missing_ok=True)
    names = ", ".join(str(f.relative_to(root)) if f.is_relative_to(root) else str(f) for f in stale)
    verb = "would remove" if dry_run else "removed"
    return f"promote: {verb} {names}, left by a git or DVC process that is gone (killed or crashed)\n"
