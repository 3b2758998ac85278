"""A flow run in this CLI process: against PREFECT_API_URL, or Prefect's temporary server with
the settings runledger gives it; its report, or the error in one line."""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from flows.cli.app import api_refused
from flows.cli.interrupt import INTERRUPTED, Interrupts, run_interruptibly, server_of_its_own
from flows.cli.output import error, fail

if TYPE_CHECKING:
    from prefect import State

R = TypeVar("R")

# Prefect's temporary server (no PREFECT_API_URL): the settings runledger gives it unless the
# user chose a value. On a busy machine it takes more than its default 20 s to start. Its
# analytics would phone home from machines that may have no internet, and its telemetry
# heartbeat competes for its SQLite database: "database is locked" tracebacks and "Failed to
# send telemetry" ERROR lines on the terminal of a run that worked. Stopping it at the end
# cancels its services mid-flush, which they (and SQLAlchemy's pool, through the root logger)
# log as ERROR tracebacks: CancelledError in the task run recorder, seen under load. Its logs
# stay quiet but for CRITICAL; what matters to the user reaches them through the flow run's
# state and this process's logs, whose logging Prefect set up when it was imported, before
# these variables are set.
EPHEMERAL_SERVER = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": 90,
    "PREFECT_SERVER_ANALYTICS_ENABLED": False,
    "PREFECT_SERVER_LOGGING_LEVEL": "CRITICAL",
    "PREFECT_LOGGING_ROOT_LEVEL": "CRITICAL",
}


def ephemeral_server() -> AbstractContextManager[Any]:
    """Apply EPHEMERAL_SERVER where the user set nothing: in the environment, which covers the
    server's process and threads that start without Prefect's settings context, and in the
    settings context, which covers this thread."""
    chosen = {name: value for name, value in EPHEMERAL_SERVER.items() if not os.environ.get(name)}
    if not chosen:
        return nullcontext()
    for name, value in chosen.items():
        os.environ[name] = str(value).lower()
    import prefect.settings

    # PREFECT_LOGGING_* are overrides of Prefect's logging config, read from the environment
    # only: not settings of the context.
    return prefect.settings.temporary_settings(updates={
        getattr(prefect.settings, name): value for name, value in chosen.items()
        if hasattr(prefect.settings, name)})


def run_here(start: Callable[[], Coroutine[Any, Any, State[Any]]], report: type[R],
             around: AbstractContextManager[Any] | None = None, what: str = "the flow run",
             stopped: Callable[[], None] | None = None) -> tuple[R, State[Any]]:
    """Run the flow call ``start`` makes (with ``return_state=True``) to its end, inside
    ``around`` if given, and return its report with its final state. A server refusing our
    credentials, or a flow run that ended without a report, exits with the error in one line.
    Ctrl-C stops it as flows/cli/interrupt.py says; ``stopped`` then reports what was left,
    and the command exits 130."""
    interrupts = Interrupts()
    try:
        return _run_here(start, report, around, what, stopped, interrupts)
    except KeyboardInterrupt:  # before the flow run started: while its server was starting
        error(f"Ctrl-C before {what} started: nothing ran", label="stopped")
        raise typer.Exit(INTERRUPTED) from None


def _run_here(start: Callable[[], Coroutine[Any, Any, State[Any]]], report: type[R],
              around: AbstractContextManager[Any] | None, what: str,
              stopped: Callable[[], None] | None, interrupts: Interrupts
              ) -> tuple[R, State[Any]]:
    with ephemeral_server(), server_of_its_own(interrupts), around or nullcontext():
        try:
            # Prefect types a flow call as an Awaitable (it is a coroutine) and, for a flow
            # that returns a State, its final state as State[State]: it ends in the State
            # returned.
            state = run_interruptibly(start, what, interrupts)
        except KeyboardInterrupt:
            if stopped is not None:
                stopped()
            raise typer.Exit(INTERRUPTED) from None
        except Exception as exc:
            refused = api_refused(exc)
            if refused is None:
                raise
            raise fail(RuntimeError(refused)) from None
    from flows.run_job.outcomes import state_value

    value = state_value(state)
    if not isinstance(value, report):
        raise fail(value if isinstance(value, BaseException) else RuntimeError(state.message))
    return value, state
