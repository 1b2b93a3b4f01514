"""Named points where a run can be stopped dead, so that a supervisor can SIGKILL it exactly there.

`resume_check` and the tests kill training at an exact update, between micro-batches or inside
the checkpoint protocol; everywhere else these are no-ops.
"""

from __future__ import annotations

import os
import signal

PAUSE_ENV = "REPROGATE_PAUSE_AT"


def pause_if(where: str) -> None:
    """Stop at `where` when REPROGATE_PAUSE_AT names it, after saying so on stdout."""
    if os.environ.get(PAUSE_ENV) == where:
        print(f"REPROGATE-PAUSED {where}", flush=True)
        while True:
            signal.pause()
