"""Run telemetry: what one run of a stage measured about itself, kept out of DVC's files.

Wall time, throughput, peak memory, the measured projection, whether the run resumed: these
change every time the same inputs are run again, so in a DVC metric file they made every
reproduction a change to commit (and `dvc.lock` churn). Each run of a stage appends one
RunLogEntry line to logs/<stage>.jsonl instead (`runner.run` does, for every stage: its wall
time and peak memory, and whatever else the stage measured): git-ignored, never a DVC output
(DVC neither deletes nor caches it), read by people and by the run registry. A stage restored
from DVC's cache did not run, and logs nothing.

Training also keeps a raw log of its updates (UpdateLog): one line per optimizer update as it
happened, a resumed run's repeated updates included, which the registry's metrics_raw reads.
"""

from __future__ import annotations

import os
import resource
import socket
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import AwareDatetime

from reprogate.records.base import Record
from reprogate.utils import git, jsonl


class RunLogEntry(Record):
    """One line of logs/<stage>.jsonl: a run of a stage, when and where it finished, and what it
    measured about itself (wall time, throughput, memory, resumption, projection)."""

    stage: str  # train@ngram, resume_check@ngram, prepare, ...
    finished_at: AwareDatetime  # UTC
    host: str
    code_commit: str | None  # HEAD when the run finished; None outside a git repository
    code_dirty: bool | None  # whether the working tree differed from HEAD
    telemetry: dict[str, Any]


class UpdateLine(Record):
    """One line of runs/<m>/updates/<train key>.jsonl: an optimizer update as it happened. A run
    killed and resumed repeats the updates after its last checkpoint: both are kept here (the
    registry's metrics_raw); plots/<m>/train.tsv holds the one value per step that survived."""

    attempt: AwareDatetime  # when the process that made this update started (UTC)
    step: int
    loss: float
    lr: float
    at: AwareDatetime  # UTC


def peak_rss_gb() -> float:
    """Peak resident memory of this process (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 30) if sys.platform == "darwin" else peak / (1 << 20)


def _commit(root: Path) -> tuple[str | None, bool | None]:
    if git.git_dir(root) is None:
        return None, None
    head = git.head(root)
    # --no-optional-locks: a stage's `git status` must not take the index lock from a user's git.
    status = git.run(root, "--no-optional-locks", "status", "--porcelain", "-uno", check=False)
    return head, bool(status) if head else None


def append(root: Path, log: Path, stage: str, telemetry: dict[str, Any]) -> RunLogEntry:
    """Add this run's line to `log`. One write of one line in append mode: two runs finishing
    at once interleave whole lines, never parts of them."""
    commit, dirty = _commit(root)
    entry = RunLogEntry(
        stage=stage,
        finished_at=datetime.now(UTC),
        host=socket.gethostname(),
        code_commit=commit,
        code_dirty=dirty,
        telemetry=telemetry,
    )
    log.parent.mkdir(parents=True, exist_ok=True)
    line = jsonl.line(entry.model_dump(mode="json"), sort_keys=True).encode()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return entry


def read(log: Path) -> tuple[list[RunLogEntry], list[int]]:
    """Every entry of `log`, oldest first, and the numbers of the lines that are not entries
    (a hand edit, a partial line from a full disk), for the reader to name: telemetry is never
    evidence a decision rests on, so a damaged line does not hide the others."""
    if not log.is_file():
        return [], []
    entries, bad = [], []
    for i, raw in enumerate(log.read_bytes().splitlines(), start=1):
        try:
            entries.append(RunLogEntry.model_validate_json(raw))
        except ValueError:
            bad.append(i)
    return entries, bad


class UpdateLog:
    """A trainer callback: one UpdateLine per optimizer update, appended to `path` by rank 0 and
    flushed at once, so a killed run keeps every update it made (the next attempt repeats the
    ones after its checkpoint, with its own `attempt` time). It reads the trainer's record of
    the update and changes nothing, so it cannot move a resumed run off its bitwise path."""

    def __init__(self, path: Path, rank: int):
        self.path, self.rank = path, rank
        self.attempt = datetime.now(UTC)
        self._file = None

    def on_update(self, trainer) -> None:
        if self.rank != 0:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        p = trainer.progress
        line = UpdateLine(
            attempt=self.attempt, step=p.global_step, loss=p.losses[-1], lr=p.lrs[-1], at=datetime.now(UTC)
        )
        self._file.write(jsonl.line(line.model_dump(mode="json"), sort_keys=True))
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
