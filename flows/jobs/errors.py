"""How a job's failures are classified: a transient failure is retried with backoff, anything
else fails the Run for good (``ledger.fail(retryable=False)``) until an operator requeues it."""

from __future__ import annotations

import sqlite3

from sqlalchemy.exc import DBAPIError, OperationalError

from store import InvalidInput, LedgerBusy, RunledgerError


class JobError(RunledgerError):
    """A job failed."""


class TransientError(JobError):
    """A transient failure (timeout, rate limit, 5xx, lost connection); retrying may succeed."""

    def __init__(self, message: str | None = None, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentError(JobError):
    """A failure that retrying cannot fix; the Run is marked failed."""


class ValidationFailed(PermanentError, InvalidInput):
    """The candidate output failed validation; nothing was persisted."""


class UnknownJob(InvalidInput):
    """No job is registered under that name."""


class UnknownSubject(InvalidInput):
    """The job has no such subject."""


class InvalidJob(InvalidInput):
    """A job definition is invalid."""


TRANSIENT = (TransientError, TimeoutError, ConnectionError, LedgerBusy)


def is_transient(error: BaseException) -> bool:
    """True for failures worth retrying: timeouts, connection errors, a busy or unreachable
    ledger database, and anything a job raises as ``TransientError``."""
    if isinstance(error, TRANSIENT):
        return True
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    # SQLite reports a missing table as OperationalError too: only a server's is a lost link.
    return isinstance(error, OperationalError) and not isinstance(error.orig, sqlite3.Error)
