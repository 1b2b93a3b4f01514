"""Named points where a run can be stopped dead, so that a supervisor can SIGKILL it exactly there.

`resume_check` and the tests kill training at an exact update, between micro-batches or inside
the checkpoint protocol; everywhere else these are no-ops.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

PAUSE_ENV = "REPROGATE_PAUSE_AT"
# Only this rank stops, and only in the worker group's first attempt: a group the elastic agent
# restarts after the kill runs through.
PAUSE_RANK_ENV = "REPROGATE_PAUSE_RANK"
# Where each rank writes its process id (and `rankN.paused` once stopped): the elastic agent
# starts every worker in a session of its own, so a supervisor kills them by id.
PIDS_ENV = "REPROGATE_RANK_PIDS"
# The worker group's attempt under Ray Train (0 first), set by ray_engine in each worker as the
# elastic agent sets TORCHELASTIC_RESTART_COUNT.
ATTEMPT_ENV = "REPROGATE_ATTEMPT"


def attempt() -> int:
    """How often the executor has restarted this run's worker group (0: the first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or os.environ.get(ATTEMPT_ENV) or 0)


def pause_if(where: str) -> None:
    """Stop at `where` when REPROGATE_PAUSE_AT names it, after saying so on stdout."""
    if os.environ.get(PAUSE_ENV) != where:
        return
    rank = os.environ.get("RANK", "0")
    only = os.environ.get(PAUSE_RANK_ENV)
    if only is not None and (rank != only or attempt() != 0):
        return
    print(f"REPROGATE-PAUSED {where}", flush=True)
    if folder := os.environ.get(PIDS_ENV):
        Path(folder, f"rank{rank}.paused").write_text(where)
    while True:
        signal.pause()
