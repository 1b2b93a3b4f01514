"""Files and folders written whole: built in a temporary sibling, then renamed over the old one.

A reader never sees half a file or folder, and a failure leaves the old one in place. The
sibling is named after the process that builds it, so one left behind by a killed process
(SIGKILL runs no cleanup) is recognised and removed by the next writer instead of piling up.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def remove_stale(out: Path) -> None:
    """Delete temporary siblings of `out` whose writing process is gone."""
    for tmp in out.parent.glob(f".{out.name}.tmp-*"):
        pid = tmp.name.rpartition("-")[2]
        if pid.isdigit() and not _alive(int(pid)):
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)


def write_file(out: Path, data: bytes, hook: Callable[[str], None] = lambda phase: None) -> None:
    """`out` holds `data` whole, or (after a kill or an error at any point) what it held before:
    written to a temporary sibling, fsynced, renamed over `out`, and the folder fsynced so the
    rename itself survives a power cut. `hook` is called at each phase (tests stop there)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data[: len(data) // 2])
            hook("half")
            f.write(data[len(data) // 2 :])
            f.flush()
            os.fsync(f.fileno())
        hook("synced")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(out.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def replace_dir(out: Path, mode: int = 0o755) -> Iterator[Path]:
    """Yield an empty temporary folder; when the block ends without an error it becomes `out`
    (an existing `out` is replaced), otherwise it is deleted and `out` is left as it was."""
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    tmp.chmod(mode)
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
