"""Named fault-injection points for crash tests: a process whose RUNLEDGER_FAULTS lists a point
kills itself with SIGKILL when it gets there (after a commit, before it acknowledges)."""

from __future__ import annotations

import os
import signal

ENV = "RUNLEDGER_FAULTS"


def fault_point(name: str) -> None:
    """SIGKILL this process here if ``name`` is listed in $RUNLEDGER_FAULTS."""
    listed = os.environ.get(ENV)
    if listed and name in listed.split(","):
        os.kill(os.getpid(), signal.SIGKILL)
