"""A command run until a fault point kills it, in a session of its own: once it died, whatever
it left running in that session is killed too (a child that inherited its output, a Prefect
server or a multiprocessing helper, would otherwise outlive it and hold the output open)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Sequence


def run_killed(args: Sequence[str], env: dict[str, str],
               timeout: float) -> subprocess.CompletedProcess[str]:
    """``args`` run to their end (a SIGKILL at a fault point, or an exit), then the rest of
    their session killed; their output read from files, never from a pipe a survivor holds."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(list(args), env=env, stdout=out, stderr=err, text=True,
                                   start_new_session=True)
        try:
            code = process.wait(timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(list(args), code, out.read(), err.read())
