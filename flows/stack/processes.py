"""Child processes of a local stack, and stopping every one of them.

Each child starts in a session of its own (so a Ctrl-C in the terminal reaches only the stack,
which then stops the children in order) and carries a stack tag in its environment. Prefect's
process worker starts each flow run in yet another session, so process groups alone cannot find
them; the tag can, because every descendant inherits it, even one whose parent was killed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from store import RunledgerError

STACK_ENV = "RUNLEDGER_STACK_ID"
PROC = Path("/proc")


class StackError(RunledgerError):
    """The local stack could not be started or stopped."""


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM if the stack process itself is killed."""
    if sys.platform == "linux":
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _children_of(pid: int) -> list[int]:
    found: list[int] = []
    for task in (PROC / str(pid) / "task").glob("*/children"):
        with contextlib.suppress(OSError):
            found.extend(int(p) for p in task.read_text().split())
    return found


def descendants(pid: int) -> list[int]:
    """Every living descendant of ``pid`` (children first), whatever session it is in."""
    found: list[int] = []
    queue = _children_of(pid)
    while queue:
        child = queue.pop(0)
        found.append(child)
        queue.extend(_children_of(child))
    return found


def _send(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _alive(pid: int) -> bool:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    # A zombie has exited already; only its parent's wait() is missing.
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass
class Child:
    """One started process: its name in the stack, the Popen handle, its log file, and how it
    was started (to start it again)."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: Path | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Supervisor:
    """Starts tagged children and stops them all: SIGTERM in reverse start order, then SIGKILL
    for whatever still carries the tag after the grace period."""

    def __init__(self, log_dir: Path, grace_seconds: float = 15.0) -> None:
        self.log_dir = log_dir
        self.grace_seconds = grace_seconds
        self.stack_id = uuid.uuid4().hex
        self.children: list[Child] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path | None = None,
    ) -> Child:
        log = self.log_dir / f"{name}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                list(argv),
                env={**env, STACK_ENV: self.stack_id},
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        child = Child(name, process, log, list(argv), dict(env), cwd)
        self.children.append(child)
        return child

    def restart(self, child: Child) -> Child:
        """Start an exited child again, as it was started, in its place in the stop order."""
        again = self.start(child.name, child.argv, child.env, child.cwd)
        self.children.remove(again)
        self.children[self.children.index(child)] = again
        return again

    def tagged(self) -> list[int]:
        """Pids of every living process that carries this stack's tag."""
        marker = f"{STACK_ENV}={self.stack_id}".encode()
        me = os.getpid()
        pids: list[int] = []
        for entry in PROC.iterdir():
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if marker in environ.split(b"\0") and _alive(int(entry.name)):
                pids.append(int(entry.name))
        return pids

    def kill(self, child: Child) -> list[int]:
        """SIGKILL a child and everything it started, at once (a host dying mid-work)."""
        victims = [child.pid, *descendants(child.pid)]
        for pid in victims:
            _send(pid, signal.SIGKILL)
        child.process.wait()
        self._wait_gone(victims, 10.0)
        return victims

    def terminate(self, child: Child, grace_seconds: float | None = None) -> None:
        """SIGTERM one child's process group; SIGKILL it and its descendants after the grace."""
        grace = self.grace_seconds if grace_seconds is None else grace_seconds
        if child.running():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGTERM)
            try:
                child.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.kill(child)
        child.process.poll()

    def stop(self) -> list[int]:
        """Stop every child, newest first, then sweep tagged stragglers; return what had to be
        SIGKILLed by the sweep (empty when everything shut down by itself)."""
        for child in reversed(self.children):
            self.terminate(child)
        stragglers = self.tagged()
        for pid in stragglers:
            _send(pid, signal.SIGTERM)
        if not self._wait_gone(stragglers, 5.0):
            for pid in self.tagged():
                _send(pid, signal.SIGKILL)
            self._wait_gone(stragglers, 5.0)
        return stragglers

    def _wait_gone(self, pids: Sequence[int], seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not any(_alive(pid) for pid in pids):
                return True
            time.sleep(0.1)
        return not any(_alive(pid) for pid in pids)
