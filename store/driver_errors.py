"""The one place where driver and SQLAlchemy errors become runledger's own: whoever calls the
ledger sees a ``RunledgerError`` whose ``retryable`` says whether trying again can help."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy import exc

from store.errors import (
    CreateInDoubt,
    IdentityRace,
    LedgerBusy,
    LedgerError,
    LedgerUnavailable,
    RunledgerError,
)

IDENTITY_INDEX = "uq_runs_identity"
IN_DOUBT_INDEX = "uq_batches_create_in_doubt"


def is_locked(error: exc.OperationalError) -> bool:
    """SQLite's "database is locked": another writer holds the lock; nothing was written."""
    text = str(error.orig).lower()
    return "database is locked" in text or "database is busy" in text


def _missing_schema(orig: BaseException | None) -> bool:
    if isinstance(orig, psycopg.errors.UndefinedTable):
        return True
    return isinstance(orig, sqlite3.OperationalError) and "no such table" in str(orig)


def domain_error(error: exc.StatementError, lock_timeout_ms: int) -> RunledgerError:
    """The runledger error for a failed statement (``error`` is raised from it)."""
    orig = error.orig
    if isinstance(orig, RunledgerError):  # our own validation, raised inside a bind processor
        return orig
    detail = str(orig).strip()
    if isinstance(orig, psycopg.errors.LockNotAvailable):
        return LedgerBusy(
            f"a PostgreSQL lock the ledger needed stayed held longer than its lock timeout "
            f"({lock_timeout_ms} ms, RUNLEDGER_POSTGRES_LOCK_TIMEOUT_MS): nothing was "
            f"written, retry later ({detail})"
        )
    constraint = getattr(getattr(orig, "diag", None), "constraint_name", None)
    if isinstance(error, exc.IntegrityError) and constraint == IDENTITY_INDEX:
        return IdentityRace()
    if isinstance(error, exc.IntegrityError) and constraint == IN_DOUBT_INDEX:
        # Two submitters stored an inline file at once (PostgreSQL, read committed).
        return CreateInDoubt(f"another batch's create of the same kind is in doubt: {detail}")
    if isinstance(error, exc.DBAPIError) and error.connection_invalidated:
        return LedgerUnavailable(f"the ledger database dropped the connection: {detail}")
    if _missing_schema(orig):
        return LedgerError(f"the ledger schema is missing or out of date "
                           f"({detail.splitlines()[0]}): run `runledger db upgrade`")
    if isinstance(error, exc.OperationalError) and isinstance(orig, sqlite3.Error):
        if is_locked(error):
            return LedgerBusy(f"the SQLite ledger is locked by another writer: {detail}")
        return LedgerError(f"the SQLite ledger refused the statement: {detail}")
    if isinstance(error, exc.OperationalError):  # a server's: restarts, deadlocks, lost links
        return LedgerUnavailable(f"the ledger database failed the statement: {detail}")
    return LedgerError(f"the ledger database refused the statement: {detail}")


@contextmanager
def domain_errors(lock_timeout_ms: int) -> Iterator[None]:
    """Raise every statement error inside as its runledger error (see ``domain_error``)."""
    try:
        yield
    except exc.StatementError as error:
        converted = domain_error(error, lock_timeout_ms)
        if converted is error.orig:
            raise converted from None
        raise converted from error
    except (psycopg.Error, sqlite3.Error) as error:  # sent on the driver outside SQLAlchemy
        base = psycopg.Error if isinstance(error, psycopg.Error) else sqlite3.Error
        wrapped = exc.DBAPIError.instance(None, None, error, base)
        raise domain_error(wrapped, lock_timeout_ms) from error
