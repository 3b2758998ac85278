"""Ctrl-C for the commands that run flows in this process (`runledger run`, `runledger
backfill`), whether it reaches the process alone or the terminal's whole process group.

Without PREFECT_API_URL the command starts a Prefect server of its own in a session of its own
(flows/stack/private_server.py), so the group's SIGINT does not kill the server its flow run
still reports to. The first Ctrl-C says what happens to the subjects in flight and cancels the
flow: subjects whose stage is under way (a model call) finish that stage and complete, the
others start no stage and are released (pending) for a later run; the flow run ends Cancelled. A second Ctrl-C releases the
Runs still leased and exits at once. Either way the exit status is 130."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar, cast

from flows.run_job.lease_keeper import abandon_every_lease
from flows.run_job.stop import interrupt_process

T = TypeVar("T")
INTERRUPTED = 130  # a shell's status for a command ended by SIGINT


@dataclass
class Interrupts:
    """How many Ctrl-Cs this command took, and how to stop what it started at once."""

    count: int = 0
    on_exit: list[Callable[[], None]] = field(default_factory=list)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@contextmanager
def server_of_its_own(interrupts: Interrupts) -> Iterator[None]:
    """PREFECT_API_URL's server if set; else a private one for this command, set as
    PREFECT_API_URL while inside, stopped (after the flow run's events are sent) on the way
    out or by a second Ctrl-C."""
    import prefect.settings
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME

    if PREFECT_API_URL.value():
        yield
        return
    from flows.stack.private_server import private_server

    _say("starting a Prefect server of this command's own (set PREFECT_API_URL to use yours)")
    with private_server(Path(PREFECT_HOME.value())) as server, \
            prefect.settings.temporary_settings(updates={PREFECT_API_URL: server.url}):
        # Also for threads that start without the settings context.
        os.environ["PREFECT_API_URL"] = server.url
        interrupts.on_exit.append(server.stop)
        try:
            yield
        finally:
            _drain_events()
            os.environ.pop("PREFECT_API_URL", None)


def _drain_events() -> None:
    """Send the events and logs still queued while the server is up (after it stops they
    would fail, one error every few seconds)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (EventsWorker, APILogWorker):
        worker.drain_all(timeout=10, at_exit=False)


def run_interruptibly(start: Callable[[], Coroutine[Any, Any, T]], what: str,
                      interrupts: Interrupts) -> T:
    """``asyncio.run`` of the flow call ``start`` makes, with Ctrl-C handled as the module
    says; ``what`` names the work in the messages (``job x, period y``). A stopped flow raises
    ``KeyboardInterrupt`` here once it has stopped. The handler stays in place until the
    stages' threads are done, which asyncio waits for after the flow ended."""
    running: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[T]]] = []

    async def main() -> T:
        task = asyncio.current_task()
        assert task is not None
        running.append((asyncio.get_running_loop(), cast("asyncio.Task[T]", task)))
        return await start()

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        interrupts.count += 1
        if interrupts.count == 1:
            _say(f"Ctrl-C: stopping {what}. Subjects at a stage now (a model call) finish "
                 "it and complete, with their emails queued; the others start nothing and "
                 "are released (pending) for a later run. Ctrl-C again to stop at once.")
            interrupt_process()
            for loop, task in running:
                loop.call_soon_threadsafe(task.cancel)
            return
        released = abandon_every_lease("interrupted: a second Ctrl-C stopped the command "
                                       "during this stage")
        _say(f"Ctrl-C again: released {len(released)} Run(s) still at a stage (pending, for a "
             "later run); stopping now.")
        for stop in interrupts.on_exit:
            stop()
        os._exit(INTERRUPTED)  # the stages' threads cannot be interrupted: not waited for

    # Not asyncio's own handler (which it installs only over Python's default one): that one
    # is gone while asyncio waits for the stages' threads, where a second Ctrl-C matters most.
    main_thread = threading.current_thread() is threading.main_thread()  # signals go there
    previous = signal.signal(signal.SIGINT, on_sigint) if main_thread else None
    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if interrupts.count:
            raise KeyboardInterrupt from None
        raise
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)
