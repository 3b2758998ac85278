"""The Ledger: the durable authority for Runs and their outbox. Each public method is one unit
of work (one transaction, or one statement in autocommit where its transition says so) around
one transition or read of the module named after its noun (``store.runs``, ``store.revisions``,
``store.outbox``, ``store.occurrences``, ``store.stats``, ``store.tombstones``)."""

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
from store.call_book import CallBook
from store.completion import UNRECORDED, CompletedBy, Completion, Effect
from store.database import Busy, Database, SQLiteSynchronous
from store.dialect import Storage, ledger_storage, vacuum
from store.driver_errors import domain_errors
from store.errors import (
    IdentityRace,
    InvalidInput,
    LedgerError,
    LedgerNotReady,
    LedgerUnavailable,
)
from store.identity import RunIdentity, params_fingerprint
from store.ids import resolve_message_id, resolve_run_id
from store.lease import Claim, Registration
from store.message import OutboxMessage
from store.models import Attempt, DeliveryAttempt, Occurrence, QueuedMessage, Run
from store.occurrences import (
    RunState,
    claim_events_txn,
    give_up_txn,
    list_occurrences,
    mark_emitted_txn,
    mark_overdue_txn,
    mark_recovered_txn,
    owe_txn,
    read_obligations,
    run_states,
    skip_txn,
    unskip_txn,
)
from store.outbox import (
    NO_REPLY,
    MessageClaim,
    Reply,
    claim_messages_txn,
    count_messages,
    get_message,
    list_delivery_attempts,
    list_messages,
    list_recent_messages,
    mark_dead_txn,
    mark_sent_txn,
    mark_uncertain_txn,
    release_message_txn,
    requeue_message_txn,
    schedule_retry_txn,
)
from store.revisions import Revision, list_revisions, request_revision_txn
from store.runs import (
    FinishedRun,
    claim_txn,
    complete_txn,
    complete_with_effect_txn,
    fail_txn,
    get_finished_runs,
    get_runs,
    list_attempts,
    list_attempts_of,
    list_runs,
    register_and_claim_txn,
    register_txn,
    renew_many_txn,
    requeue_run_txn,
    require_run,
    save_input_txn,
)
from store.settings import LedgerSettings
from store.statement import Transition
from store.stats import Activity, count_suppressed_txn, read_activity
from store.tombstones import Prunable, Pruned, count_prunable, prune_batch_txn
from store.validators import error_text, json_document, lease_seconds, revision_reason

MIGRATIONS = Path(__file__).with_name("migrations")
IDENTITY_RACE_TRIES = 3

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
    """Runs, attempts and outbox messages on PostgreSQL (many hosts) or SQLite (one host)."""

    def __init__(self, database: Database, *, max_output_bytes: int = 1_000_000) -> None:
        if max_output_bytes < 1:
            raise InvalidInput(f"max_output_bytes must be positive, got {max_output_bytes}")
        self.database = database
        self.max_output_bytes = max_output_bytes
        self.calls = CallBook(self)

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
            if not path.is_file():
                raise LedgerNotReady(
                    f"no ledger at {shown}: {path.resolve()} does not exist (working folder "
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
                                 "create it with `runledger db upgrade`") from None
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
        done = self.database.write(lambda conn: txn(conn, *args, **kwargs),
                                   single_statement=self.dialect in txn.one_statement_on)
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

    def attempts(self, run_id: str) -> list[Attempt]:
        """A Run's Attempts, oldest first."""
        return self._read(list_attempts, run_id)

    def attempts_of(self, run_ids: Sequence[str]) -> dict[str, list[Attempt]]:
        """The Attempts of each of ``run_ids``, oldest first, in one read."""
        return self._read(list_attempts_of, run_ids)

    # --- What a job owes -----------------------------------------------------------------

    def owe(self, job: str, owed_from: dict[str, datetime]) -> dict[str, datetime]:
        """Record from which period ``job`` owes each subject not recorded yet; every recorded
        subject of the job with its period (see ``owe_txn``)."""
        return self._write(faults.AFTER_OWE_COMMIT, owe_txn, job, owed_from)

    def obligations(self, job: str) -> dict[str, datetime]:
        """Every subject ``job`` owes, with the period it is owed from."""
        return self._read(read_obligations, job)

    def skip(self, skipped: Sequence[tuple[RunIdentity, str]]) -> list[str]:
        """Record occurrences skipped by the missed-run policy, with their reasons (never one
        that has a Run); the run ids newly skipped."""
        return self._write(faults.AFTER_SKIP_COMMIT, skip_txn, skipped)

    def unskip(self, run_ids: Sequence[str]) -> list[str]:
        """Clear the skip of occurrences an operator runs on purpose; the run ids cleared."""
        return self._write(faults.AFTER_UNSKIP_COMMIT, unskip_txn, run_ids)

    def mark_overdue(self, identities: Sequence[RunIdentity]) -> list[str]:
        """Report occurrences overdue once each; the run ids reported by this call."""
        return self._write(faults.AFTER_MARK_OVERDUE_COMMIT, mark_overdue_txn, identities)

    def mark_recovered(self, job: str) -> list[Occurrence]:
        """Report once each overdue occurrence of ``job`` whose Run completed since."""
        return self._write(faults.AFTER_MARK_RECOVERED_COMMIT, mark_recovered_txn, job)

    def give_up(self, run: RunState, max_attempts: int) -> bool:
        """Fail a stranded Run past ``max_attempts`` for good, recorded on its occurrence (see
        ``give_up_txn``)."""
        return self._write(faults.AFTER_GIVE_UP_COMMIT, give_up_txn, run, max_attempts)

    def claim_events(self, job: str, lease: timedelta | float) -> list[Occurrence]:
        """Lease the occurrences of ``job`` whose decisions' events are not known to be emitted
        (see ``claim_events_txn``); emit them, then ``mark_emitted``."""
        return self._write(faults.AFTER_CLAIM_EVENTS_COMMIT, claim_events_txn,
                           job, lease_seconds(lease))

    def mark_emitted(self, claimed: Sequence[Occurrence]) -> None:
        """Record the claimed occurrences' unemitted decisions' events as emitted."""
        self._write(faults.AFTER_MARK_EMITTED_COMMIT, mark_emitted_txn, claimed)

    def run_states(self, job: str, since: datetime) -> list[RunState]:
        """Where each Run of ``job`` from period ``since`` on stands, oldest first."""
        return self._read(run_states, job, since)

    def occurrences(self, job: str, since: datetime) -> list[Occurrence]:
        """The recorded occurrences (skips, alerts) of ``job`` from period ``since`` on."""
        return self._read(list_occurrences, job, since)

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

    # --- Retention ------------------------------------------------------------------------

    def prune_batch(self, cutoff: datetime, jobs: Sequence[str], *, limit: int = 1000,
                    after: str = "") -> Pruned:
        """Make tombstones of the Runs of ``jobs`` completed before ``cutoff`` among the next
        ``limit`` after ``after``, in one short transaction (see ``prune_batch_txn``); pass
        the returned cursor as ``after`` to the next batch, until it is None."""
        return self._write(faults.AFTER_PRUNE_BATCH_COMMIT, prune_batch_txn,
                           cutoff, jobs, limit, after)

    def prunable(self, cutoff: datetime, jobs: Sequence[str]) -> Prunable:
        """What pruning ``jobs`` with ``cutoff`` would do and leave alone, without writing."""
        return self._read(count_prunable, cutoff, jobs)

    def storage(self) -> Storage:
        """The space the ledger's tables take, as the database reports it."""
        return self._read(ledger_storage)

    def vacuum(self) -> None:
        """Make the space freed by pruning reusable (PostgreSQL: a plain VACUUM; see
        ``store.dialect.vacuum``)."""
        with domain_errors(self.database.busy.postgres_lock_timeout_ms), \
                self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            vacuum(conn)

    # --- Outbox ---------------------------------------------------------------------------

    def claim_messages(
        self, owner: str, limit: int, lease: timedelta | float, channel: str | None = None
    ) -> list[MessageClaim]:
        """Lease up to ``limit`` due messages (see ``claim_messages_txn``)."""
        return self._write(faults.AFTER_CLAIM_MESSAGES_COMMIT, claim_messages_txn,
                           owner, limit, lease_seconds(lease), channel)

    def mark_sent(
        self, sent: Sequence[tuple[MessageClaim, Reply]]
    ) -> list[MessageClaim]:
        """Mark the messages sent in one statement or transaction (a message the same claim
        marked already counts as marked); returns the claims whose lease was lost (their rows
        are unchanged)."""
        return self._write(faults.AFTER_MARK_SENT_COMMIT, mark_sent_txn, sent)

    def schedule_retry(
        self, claim: MessageClaim, delay: float, error: str, reply: Reply = NO_REPLY
    ) -> None:
        """sending -> retry, due again after ``delay`` seconds (database clock)."""
        self._write(faults.AFTER_SCHEDULE_RETRY_COMMIT, schedule_retry_txn,
                    claim, delay, error, reply)

    def mark_uncertain(
        self, claim: MessageClaim, error: str, retry_in: float | None,
        reply: Reply = NO_REPLY,
    ) -> None:
        """sending -> uncertain: the receiver may have it (see ``mark_uncertain_txn``)."""
        self._write(faults.AFTER_MARK_UNCERTAIN_COMMIT, mark_uncertain_txn,
                    claim, error, retry_in, reply)

    def mark_dead(self, claim: MessageClaim, error: str, reply: Reply = NO_REPLY) -> None:
        """sending -> dead: only an operator requeues it."""
        self._write(faults.AFTER_MARK_DEAD_COMMIT, mark_dead_txn, claim, error, reply)

    def release_message(self, claim: MessageClaim) -> None:
        """Give back a claimed message never handed to a transport (see ``release_message_txn``)."""
        self._write(faults.AFTER_RELEASE_MESSAGE_COMMIT, release_message_txn, claim)

    def requeue_message(self, message_id: str) -> QueuedMessage:
        """Operator action: a retry, uncertain or dead message is due now, with the same key."""
        return self._write(faults.AFTER_REQUEUE_MESSAGE_COMMIT, requeue_message_txn, message_id)

    def message(self, message_id: str) -> QueuedMessage | None:
        """The outbox message with this id, if any."""
        return self._read(get_message, message_id)

    def resolve_message_id(self, prefix: str) -> str:
        """The id of the one outbox message whose id starts with ``prefix``."""
        return self._read(resolve_message_id, prefix)

    def messages(
        self, *, status: str | None = None, run_id: str | None = None,
        channel: str | None = None, limit: int = 100,
    ) -> list[QueuedMessage]:
        """Outbox messages, oldest first."""
        return self._read(list_messages, status=status, run_id=run_id, channel=channel,
                          limit=limit)

    def recent_messages(
        self, *, status: str | None = None, run_id: str | None = None,
        channel: str | None = None, limit: int = 100,
    ) -> list[QueuedMessage]:
        """The newest ``limit`` outbox messages, newest first."""
        return self._read(list_recent_messages, status=status, run_id=run_id, channel=channel,
                          limit=limit)

    def delivery_attempts(self, message_id: str) -> list[DeliveryAttempt]:
        """A message's delivery attempts, first try first."""
        return self._read(list_delivery_attempts, message_id)

    def message_counts(self) -> dict[str, int]:
        """Outbox messages per status."""
        return self._read(count_messages)
