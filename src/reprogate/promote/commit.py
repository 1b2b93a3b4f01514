"""The commit half of `reprogate promote`: finished by the next run after a kill at any step.

The steps, each safe to repeat, and what the next run does after a kill there:
1. the journal (<git dir>/reprogate/promotion.json, written whole) holds the record, commit
   message and tag of a promotion whose checks passed at commit `base`;
2. models/production.json is written whole (a temporary file, fsync, rename), and every gate the
   project has built is judged again against it (promote/regate.py: they depend on it);
3. `git add`, `git commit -- models/production.json models/shipped` (the files promote shipped
   with the project, when it declares that remote) and the files the gates rewrote;
4. `git tag -a <artifact>@v<semver>` and `git tag -a <artifact>#prod#<n>` (GTO's version and stage);
5. the journal is removed.
A journal found at start is finished from what git shows: HEAD still at `base` means steps 2-3
again; HEAD at the promotion commit means 4 again. Nothing else is guessed. `predict` and
`serve` answer with the record HEAD holds and refuse a working-tree record that differs, so
between 2 and 3 they say a promotion is unfinished rather than answer with an uncommitted model.
Only one promote runs at a time (an flock in the git folder, released by the kernel on death).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from reprogate.promote import regate
from reprogate.records.base import dumps, parse
from reprogate.records.production import PromotionJournal
from reprogate.utils import atomic, git
from reprogate.utils.errors import UserError
from reprogate.utils.paths import PRODUCTION, SHIPPED
from reprogate.utils.pause import pause_if


def refuse_detached(root: Path) -> None:
    """A commit made on a detached HEAD is on no branch (and `git push origin HEAD` would make a
    branch named HEAD): refused in one paragraph."""
    head = git.head(root)
    if head and not git.run(root, "symbolic-ref", "-q", "HEAD", check=False):
        raise UserError(
            f"promotion refused: HEAD is detached (at {head[:12]}), so the promotion commit would be "
            "on no branch; check out the branch to promote on (`git switch main`), then promote again."
        )


@contextmanager
def exclusive(root: Path, git_dir: Path) -> Iterator[None]:
    path = git_dir / git.PROMOTE_LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise UserError(
                f"another `reprogate promote` is running in {root} (pid {pid}); wait for it to end, "
                "then run promote again."
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the flock


def pending(git_dir: Path) -> PromotionJournal | None:
    """The promotion a killed promote began, if any. The journal is written whole or not at all;
    one that does not read (edited by hand) is dropped, and the checks run again."""
    path = git_dir / git.PROMOTION_JOURNAL
    journal, why = parse(path, PromotionJournal)
    if why:
        path.unlink(missing_ok=True)
    return journal


def begin(git_dir: Path, journal: PromotionJournal) -> None:
    atomic.write_file(git_dir / git.PROMOTION_JOURNAL, dumps(journal).encode())
    pause_if("promote:journal")


def _drop(git_dir: Path) -> None:
    (git_dir / git.PROMOTION_JOURNAL).unlink(missing_ok=True)


def _is_the_commit(root: Path, commit: str, j: PromotionJournal) -> bool:
    parent = git.run(root, "rev-parse", "-q", "--verify", f"{commit}^", check=False)
    return parent == j.base and git.committed(root, PRODUCTION, commit) == j.record.encode()


def _commit(root: Path, git_dir: Path, j: PromotionJournal) -> None:
    """Steps 2 and 3; a commit git refuses (a hook, no identity) puts everything back."""
    path = root / PRODUCTION
    atomic.write_file(path, j.record.encode(), hook=lambda phase: pause_if(f"promote:record:{phase}"))
    pause_if("promote:written")
    try:
        regated = regate.rerun(root)
    except UserError as e:
        _put_back(root, git_dir, [])
        raise UserError(f"promotion refused: the gate could not be judged again on the new record ({e}); "
                        "production is unchanged.") from None  # fmt: skip
    committed = _committed_paths(root) + regated
    git.run(root, "add", "--", *committed)
    proc = git.completed(root, "commit", "-q", "-F", "-", "--", *committed, stdin=j.message)
    if proc.returncode == 0:
        return
    _put_back(root, git_dir, regated)
    said = proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}"
    raise UserError(
        f"promotion refused: git commit failed ({said}); production is unchanged. Git needs "
        "user.name and user.email, and every commit hook must pass; fix that and promote again."
    )


def _put_back(root: Path, git_dir: Path, regated: list[str]) -> None:
    """HEAD's record and gates, in the index too: `add` staged the new ones. The files shipped
    for it leave the index and the disk (the next promote ships them again)."""
    if (root / SHIPPED).is_dir():
        git.run(root, "reset", "-q", "--", str(SHIPPED), check=False)
        git.run(root, "clean", "-q", "-f", "-d", "--", str(SHIPPED), check=False)
    if regated:
        git.run(root, "reset", "-q", "--", *regated, check=False)
        git.run(root, "checkout", "HEAD", "--", *regated, check=False)
    if git.committed(root, PRODUCTION) is not None:
        git.run(root, "reset", "-q", "--", str(PRODUCTION), check=False)
        git.run(root, "checkout", "HEAD", "--", str(PRODUCTION), check=False)
    else:
        git.run(root, "rm", "-q", "--cached", "--", str(PRODUCTION), check=False)
        (root / PRODUCTION).unlink(missing_ok=True)
    _drop(git_dir)


def _committed_paths(root: Path) -> list[str]:
    """The record, and the shipped files when the project keeps them (shipped.py)."""
    return [str(PRODUCTION)] + ([str(SHIPPED)] if (root / SHIPPED).is_dir() else [])


def _abandon(root: Path, git_dir: Path, j: PromotionJournal, head: str | None) -> UserError:
    """The branch moved on since the killed promote began: its promotion can no longer be made
    as checked. Its record leaves the working tree; the user promotes afresh."""
    path = root / PRODUCTION
    if path.is_file() and path.read_bytes() == j.record.encode():
        git.run(root, "checkout", "HEAD", "--", str(PRODUCTION), check=False)
    _drop(git_dir)
    return UserError(
        f"a promotion of {j.model_version} was interrupted at commit {j.base[:12]}, and the branch "
        f"has moved on since (HEAD is {(head or 'none')[:12]}), so it was dropped, not finished; "
        "run `reprogate promote` again to promote what the gate chooses now."
    )


def tags(j: PromotionJournal) -> list[str]:
    """The promotion's GTO tags: its version (journals written before versions have none), then
    its stage."""
    return [t for t in (j.version_tag, j.tag) if t]


def finish(root: Path, git_dir: Path, j: PromotionJournal) -> str:
    """Steps 2-5 of journal `j`, skipping what is already done; the promotion commit."""
    head = git.head(root)
    if head == j.base:
        _commit(root, git_dir, j)
        head = git.head(root)
        pause_if("promote:committed")
    elif head is None or not _is_the_commit(root, head, j):
        raise _abandon(root, git_dir, j, head)
    # The commit exists: the working tree and the index follow it (a kill inside `git commit`
    # can leave either behind).
    path = root / PRODUCTION
    if not path.is_file() or path.read_bytes() != j.record.encode():
        atomic.write_file(path, j.record.encode())
    git.run(root, "add", "--", str(PRODUCTION))
    for tag in tags(j):  # the version first: GTO registers a version before assigning it a stage
        tagged = git.run(root, "rev-parse", "-q", "--verify", f"refs/tags/{tag}^{{commit}}", check=False)
        if not tagged:
            git.run(root, "tag", "-a", tag, "-m", j.message, head)
        elif tagged != head:
            raise UserError(
                f"tag {tag} already names commit {tagged[:12]}, not the promotion commit {head[:12]}; "
                f"delete the stray tag (`git tag -d '{tag}'`) and run promote again."
            )
        pause_if("promote:tagged")
    _drop(git_dir)
    return head
