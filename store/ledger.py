"""The Ledger: the durable authority for Runs and their outbox. Each public method, of the
Ledger or of one of its books (``ledger.calls``, ``ledger.outbox``, ``ledger.occurrences``,
``ledger.retention``), is one unit of work (one transaction, or one statement in autocommit where
its transition says so) around one transition or read of the module named after its noun
(``store.registration``, ``store.runs``, ``store.run_reads``, ``store.revisions``,
``store.stats`` here; ``store.model_calls``, ``store.budgets``, ``store.outbox``,
``store.occurrences``, ``store.tombstones`` in the books: ``store.call_book``,
``store.outbox_book``, ``store.occurrence_book``, ``store.retention_book``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import sqlalchemy as sa
from sqlalchemy import MetaData
from sqlalchemy.engine import Engine

from store import faults
from store.batch_book import BatchBook
from store.call_book import CallBook
from store.completion import UNRECORDED, CompletedBy, Completion, Effect
from store.database import Busy, Database, SQLiteSynchronous
from store.dialect import Storage, ledger_storage
from store.driver_errors import domain_errors
from store.errors import (
    IdentityRace,
    InvalidInput,
    LedgerError,
    LedgerNotReady,
    LedgerUnavailable,
)
from store.identity import RunIdentity, params_fingerprint
from store.ids import resolve_run_id
from store.lease import Claim, Registration
from store.message import OutboxMessage
from store.models import Attempt, Run
from store.occurrence_book import OccurrenceBook
from store.outbox_book import OutboxBook
from store.registration import claim_txn, register_and_claim_txn, register_txn
from store.retention_book import RetentionBook
from store.revisions import Revision, list_revisions, request_revision_txn
from store.run_reads import (
    FinishedRun,
    UnfinishedRun,
    get_finished_runs,
    get_runs,
    list_attempts,
    list_attempts_of,
    list_runs,
    list_unfinished_runs,
    require_run,
)
from store.runs import (
    complete_txn,
    complete_with_effect_txn,
    fail_txn,
    renew_many_txn,
    requeue_run_txn,
    save_input_txn,
    take_over_txn,
)
from store.settings import LedgerSettings
from store.statement import Transition
from store.stats import Activity, count_suppressed_txn, read_activity
from store.validators import (
    check_owner,
    error_text,
    json_document,
    lease_seconds,
    revision_reason,
)

MIGRATIONS = Path(__file__).with_name("migrations")
IDENTITY_RACE_TRIES = 3
# The error a Run taken over keeps, and its released Attempt.
TAKEN_OVER = "an operator said its holder is dead (runledger runs release)"

P = ParamSpec("P")


@functools.cache
def _head_revision() -> str:
    """The newest migration's revision id (read once per process)."""
    # Alembic is imported here: processes that never check the schema do not pay for it.
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head



T = TypeVar("T")


class Ledger:
    """Runs, attempts and outbox messages on PostgreSQL (many hosts) or SQLite (one host).

    Runs, their attempts and revisions are the Ledger's own methods; the rest is grouped by
    noun, one book each: ``ledger.calls`` (model calls and budgets, ``CallBook``),
    ``ledger.batches`` (provider batches of queued calls, ``BatchBook``),
    ``ledger.outbox`` (outbox messages and their delivery, ``OutboxBook``),
    ``ledger.occurrences`` (what jobs owe and the decisions about it, ``OccurrenceBook``) and
    ``ledger.retention`` (pruning to tombstones, ``RetentionBook``)."""

    def __init__(self, database: Database, *, max_output_bytes: int = 1_000_000) -> None:
        if max_output_bytes < 1:
            raise InvalidInput(f"max_output_bytes must be positive, got {max_output_bytes}")
        self.database = database
        self.max_output_bytes = max_output_bytes
        self.calls = CallBook(self)
        self.batches = BatchBook(self)
        self.outbox = OutboxBook(self)
        self.occurrences = OccurrenceBook(self)
        self.retention = RetentionBook(self)

    @classmethod
    def connect(
        cls,
        url: str | None = None,
        *,
        max_output_bytes: int | None = None,
        busy_timeout_ms: int | None = None,
        locked_retries: int | None = None,
        lock_timeout_ms: int | None = None,
        sqlite_synchronous: SQLiteSynchronous | None = None,
    ) -> Ledger:
        """Open the ledger at ``url`` (default: $RUNLEDGER_DATABASE_URL, else ./runledger.db);
        unset options come from the RUNLEDGER_* environment (see ``LedgerSettings``)."""
        settings = LedgerSettings()
        busy = Busy(
            settings.sqlite_busy_timeout_ms if busy_timeout_ms is None else busy_timeout_ms,
            settings.sqlite_locked_retries if locked_retries is None else locked_retries,
            settings.postgres_lock_timeout_ms if lock_timeout_ms is None else lock_timeout_ms,
        )
        return cls(
            Database(url or settings.database_url, busy,
                     settings.sqlite_synchronous if sqlite_synchronous is None
                     else sqlite_synchronous, settings.reach()),
            max_output_bytes=settings.max_output_bytes if max_output_bytes is None
            else max_output_bytes,
        )

    @classmethod
    def open_existing(cls, url: str | None = None) -> Ledger:
        """The ledger at ``url`` (default $RUNLEDGER_DATABASE_URL), which must exist with its
        schema at the latest migration: where a flow runs, a wrong folder or a missing variable
        must be an error, never a new empty ledger beside the real one."""
        url = url or LedgerSettings().database_url
        parsed = sa.engine.make_url(url)
        shown = parsed.render_as_string(hide_password=True)
        if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
            path = Path(parsed.database or "")
            # An empty file is no ledger either, and connecting would write to it (WAL mode).
            missing = ("does not exist" if not path.is_file() else
                       "is an empty file" if path.stat().st_size == 0 else None)
            if missing:
                raise LedgerNotReady(
                    f"no ledger at {shown}: {path.resolve()} {missing} (working folder "
                    f"{Path.cwd()}). Set RUNLEDGER_DATABASE_URL to the ledger this deployment "
                    f"uses, or create it there with `runledger db upgrade`")
        ledger = cls.connect(url)
        try:
            ledger.require_schema(shown)
        except BaseException:
            ledger.close()
            raise
        return ledger

    def require_schema(self, shown: str) -> None:
        """Refuse (``LedgerNotReady``) a database whose schema is not at the latest migration."""
        try:
            found = self._read(lambda conn: conn.execute(
                sa.text("SELECT version_num FROM alembic_version")).scalars().all())
        except LedgerError:
            found = []
        except LedgerUnavailable as exc:
            if "does not exist" not in str(exc):
                raise
            raise LedgerNotReady(f"no ledger at {shown} (RUNLEDGER_DATABASE_URL): {exc}. Set "
                                 "RUNLEDGER_DATABASE_URL to the ledger this deployment uses, or "
                                 f"{_create_database_advice(self.engine.url)}") from None
        head = _head_revision()
        if head not in found:
            raise LedgerNotReady(
                f"the ledger at {shown} (RUNLEDGER_DATABASE_URL) is "
                f"{'not migrated' if not found else f'at migration {found[0]}'}, not at the "
                f"latest {head}; run `runledger db upgrade` with that RUNLEDGER_DATABASE_URL")

    @property
    def engine(self) -> Engine:
        """The transactional engine (for migrations, a job's own tables and operator tools)."""
        return self.database.engine

    @property
    def dialect(self) -> str:
        return self.database.dialect

    def _write(self, point: str, txn: Transition[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Commit ``txn``, then pass its fault ``point``: a crash test can die there, after the
        commit and before the caller hears of it."""
        one = txn.is_one_statement(self.dialect, *args, **kwargs)
        done = self.database.write(lambda conn: txn(conn, *args, **kwargs), single_statement=one)
        faults.fault_point(point)
        return done

    def _read(self, read: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self.database.read(lambda conn: read(conn, *args, **kwargs))

    def close(self) -> None:
        self.database.dispose()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def migrate(self, revision: str = "head") -> None:
        """Bring the schema to ``revision`` with Alembic (safe to call from many processes)."""
        # Alembic is imported here: workers that never migrate do not pay for it at start-up.
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        # A server that is restarting is a retryable LedgerUnavailable here too, as in every
        # other ledger call (`runledger run` migrates as it starts).
        with domain_errors(self.database.busy.postgres_lock_timeout_ms), \
                self.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, revision)

    def create_tables(self, tables: MetaData) -> None:
        """Create a job's own business tables that are missing (not the ledger's: Alembic owns
        those); safe when many processes do it at once."""
        def create() -> None:
            tables.create_all(self.engine, checkfirst=True)

        with domain_errors(self.database.busy.postgres_lock_timeout_ms):
            try:
                create()
            except (sa.exc.ProgrammingError, sa.exc.IntegrityError, sa.exc.OperationalError):
                create()  # another process created one between our check and our CREATE

    # --- Runs -----------------------------------------------------------------------------

    def register(self, identity: RunIdentity, params: dict[str, Any] | None = None) -> Run:
        """Create the Run as pending, or return the existing one (see ``register_txn``)."""
        return self._write(faults.AFTER_REGISTER_COMMIT, register_txn, identity, params)

    def claim(self, run_id: str, owner: str, lease: timedelta | float) -> Claim | None:
        """Take the Run's lease, or None if it is completed, failed or leased by someone else."""
        return self._write(faults.AFTER_CLAIM_COMMIT, claim_txn,
                           run_id, owner, lease_seconds(lease))

    def register_and_claim_many(
        self,
        entries: Sequence[tuple[RunIdentity, dict[str, Any] | None]],
        *,
        owner: str,
        lease: timedelta | float,
    ) -> dict[str, Registration]:
        """Register and claim many Runs in one statement, keyed by run id; a conflicting Run is
        reported in its Registration, not raised, so that the others proceed."""
        seconds = lease_seconds(lease)
        for attempt in range(1, IDENTITY_RACE_TRIES + 1):
            try:
                return self._write(faults.AFTER_REGISTER_AND_CLAIM_COMMIT,
                                   register_and_claim_txn, entries, owner, seconds)
            except IdentityRace:  # the statement wrote nothing: again, on the existing row
                if attempt == IDENTITY_RACE_TRIES:
                    raise
        raise AssertionError("unreachable")

    def renew_many(self, claims: Sequence[Claim], lease: timedelta | float) -> dict[str, datetime]:
        """Extend many leases in one statement; the claims left out of the result are lost."""
        return self._write(faults.AFTER_RENEW_MANY_COMMIT, renew_many_txn,
                           claims, lease_seconds(lease))

    def save_input(self, claim: Claim, raw: dict[str, Any]) -> dict[str, Any]:
        """Store the raw input once and return the stored one (the first writer's)."""
        raw = json_document(raw, "raw input", self.max_output_bytes)
        return self._write(faults.AFTER_SAVE_INPUT_COMMIT, save_input_txn, claim, raw)

    def complete(
        self,
        claim: Claim,
        output: dict[str, Any],
        messages: Sequence[OutboxMessage] = (),
        effect: Effect | None = None,
        by: CompletedBy = UNRECORDED,
    ) -> Completion:
        """Complete the Run with its outbox rows and, if given, the job's business effect, in
        one transaction (see ``complete_txn``); the Completion says whether this call did.
        ``by`` records the completing Attempt's model calls and Prefect flow and task run."""
        output = json_document(output, "output", self.max_output_bytes)
        messages = list(messages)
        if effect is None:
            return self._write(faults.AFTER_COMPLETE_COMMIT, complete_txn,
                               claim, output, messages, by)
        return self._write(faults.AFTER_COMPLETE_COMMIT, complete_with_effect_txn,
                           claim, output, messages, effect, by)

    def fail(self, claim: Claim, error: str, retryable: bool = True,
             model_calls: int = 0) -> Run:
        """Record the error and the Attempt's model calls: retryable releases the lease,
        otherwise the Run is failed."""
        return self._write(faults.AFTER_FAIL_COMMIT, fail_txn,
                           claim, error_text(error), retryable, model_calls)

    def requeue_run(self, run_id: str) -> Run:
        """Operator action: a failed Run goes back to pending (see ``requeue_run_txn``)."""
        return self._write(faults.AFTER_REQUEUE_RUN_COMMIT, requeue_run_txn, run_id)

    def take_over(self, run_id: str | None = None, *, owner: str | None = None,
                  reason: str = TAKEN_OVER) -> list[Run]:
        """Operator action: take over the lease of the running Run ``run_id``, or of every Run
        ``owner`` holds, that the operator says is dead: each goes pending with its fence raised,
        so a holder that was alive is refused at its next write (see ``take_over_txn``)."""
        if owner is not None:
            check_owner(owner)
        return self._write(faults.AFTER_TAKE_OVER_COMMIT, take_over_txn, error_text(reason),
                           run_id=run_id, owner=owner)

    def request_revision(self, run_id: str, reason: str, *,
                         params: dict[str, Any] | None = None, recollect: bool = False,
                         resend: bool = True, requested_by: str | None = None) -> Revision:
        """Operator action: ask for a new output of a completed Run (``run_id``: any of its
        revisions), as its next revision, pending (see ``request_revision_txn``): ``params``
        default to its latest completed revision's, whose stored raw input is reused unless
        ``recollect``; ``resend`` is kept on the revision (whoever resumes it queues its
        messages, or not); ``RevisionInProgress`` while a revision is unfinished."""
        reason = revision_reason(reason)
        if params is not None:
            params_fingerprint(params)  # not a JSON object: refused before anything is read
        return self._write(faults.AFTER_REQUEST_REVISION_COMMIT, request_revision_txn,
                           run_id, reason, params, bool(recollect), bool(resend), requested_by)

    def revisions(self, run_id: str) -> list[Run]:
        """Every revision of the logical run of ``run_id``, oldest first (no documents)."""
        return self._read(list_revisions, run_id)

    def get(self, run_id: str) -> Run:
        """The Run with this id; ``RunNotFound`` if there is none."""
        return self._read(require_run, run_id)

    def resolve_run_id(self, prefix: str) -> str:
        """The id of the one Run whose id starts with ``prefix`` (see ``resolve_run_id``)."""
        return self._read(resolve_run_id, prefix)

    def get_many(self, run_ids: Sequence[str]) -> dict[str, Run]:
        """The Runs among ``run_ids`` that exist, by id."""
        return self._read(get_runs, run_ids)

    def finished(self, run_ids: Sequence[str]) -> dict[str, FinishedRun]:
        """The completed and failed Runs among ``run_ids``, without their raw inputs."""
        return self._read(get_finished_runs, run_ids)

    def runs(self, *, job: str | None = None, status: str | None = None, limit: int = 100) -> list[Run]:
        """The latest Runs, newest period first."""
        return self._read(list_runs, job=job, status=status, limit=limit)

    def unfinished(self, *, job: str | None = None,
                   now: datetime | None = None) -> list[UnfinishedRun]:
        """Every Run neither completed nor failed (of ``job``, if given), oldest period first,
        each held, stranded, over-budget or pending at ``now`` (default: the database clock)."""
        return self._read(list_unfinished_runs, self.now() if now is None else now, job)

    def attempts(self, run_id: str) -> list[Attempt]:
        """A Run's Attempts, oldest first."""
        return self._read(list_attempts, run_id)

    def attempts_of(self, run_ids: Sequence[str]) -> dict[str, list[Attempt]]:
        """The Attempts of each of ``run_ids``, oldest first, in one read."""
        return self._read(list_attempts_of, run_ids)

    # --- Statistics -----------------------------------------------------------------------

    def count_suppressed(self, job: str, day: date, duplicates: int,
                         in_progress_elsewhere: int) -> None:
        """Add one tick's Runs asked for again (completed, or leased elsewhere) to the job's
        counts for the UTC ``day`` (see ``count_suppressed_txn``)."""
        self._write(faults.AFTER_COUNT_SUPPRESSED_COMMIT, count_suppressed_txn,
                    job, day, duplicates, in_progress_elsewhere)

    def activity(self, since: datetime, job: str | None = None) -> Activity:
        """What ``runledger stats`` counts from ``since`` on, optionally of one job."""
        return self._read(read_activity, since, job)

    def now(self) -> datetime:
        """The database clock, which leases and due times are judged by."""
        return self.database.now()

    # --- Storage --------------------------------------------------------------------------

    def storage(self) -> Storage:
        """The space the ledger's tables take, as the database reports it."""
        return self._read(ledger_storage)


def _create_database_advice(url: sa.URL) -> str:
    """How to create the PostgreSQL database ``url`` names (``runledger db upgrade`` creates
    its tables, not the database), then its schema."""
    parts = [f"-h {url.host}" if url.host else "", f"-p {url.port}" if url.port else "",
             f"-U {url.username}" if url.username else ""]
    command = " ".join(["createdb", *[p for p in parts if p], str(url.database)])
    name = str(url.database).replace('"', '""')
    return (f"create it with `{command}` (or the SQL `CREATE DATABASE \"{name}\";` as a user "
            "allowed to create databases), then `runledger db upgrade`")
