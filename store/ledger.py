"""The Ledger: the durable authority for Runs and their outbox. Each public method is one unit
of work (one transaction) around one transition from ``store.runs`` or ``store.outbox``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from store import outbox as ob
from store import runs as rn
from store.dialect import Busy, Database, SQLiteSynchronous, T
from store.dialect import db_now as db_clock
from store.errors import InvalidInput, MessageNotFound, RunNotFound
from store.faults import fault_point
from store.identity import RunIdentity
from store.message import OutboxMessage
from store.models import Attempt, DeliveryAttempt, QueuedMessage, Run
from store.settings import LedgerSettings

MIGRATIONS = Path(__file__).with_name("migrations")


IDENTITY_RACE_TRIES = 3

# Where a transition is one statement (plus reads at most), and so runs in autocommit: some are
# one statement everywhere, others only on PostgreSQL, whose data-modifying CTEs carry the
# follow-up writes that SQLite sends as statements of their own.
EVERYWHERE = frozenset({"postgresql", "sqlite"})
ON_POSTGRES = frozenset({"postgresql"})


def _lost_identity_race(exc: sa.exc.IntegrityError) -> bool:
    """Two workers inserted the same new Run at once and PostgreSQL reported the loser's clash
    on the identity index, which ``ON CONFLICT (run_id)`` does not arbitrate (only one unique
    index can). The statement wrote nothing; run again, it takes the existing-row path."""
    diag = getattr(exc.orig, "diag", None)
    return getattr(diag, "constraint_name", None) == "uq_runs_identity"


def _lease_seconds(lease: timedelta | float) -> float:
    value = lease.total_seconds() if isinstance(lease, timedelta) else lease
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidInput(f"lease must be a positive timedelta or number of seconds, got {lease!r}")
    return float(value)


class Ledger:
    """Runs, attempts and outbox messages on PostgreSQL (many hosts) or SQLite (one host)."""

    def __init__(self, database: Database, *, max_output_bytes: int = 1_000_000) -> None:
        if max_output_bytes < 1:
            raise InvalidInput(f"max_output_bytes must be positive, got {max_output_bytes}")
        self.database = database
        self.max_output_bytes = max_output_bytes

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
                     else sqlite_synchronous),
            max_output_bytes=settings.max_output_bytes if max_output_bytes is None
            else max_output_bytes,
        )

    @property
    def engine(self) -> Engine:
        """The transactional engine (for migrations, tests and operator tools)."""
        return self.database.engine

    def _write(
        self, work: Callable[[Connection], T], *, one_statement_on: frozenset[str] = frozenset()
    ) -> T:
        return self.database.write(work, single_statement=self.dialect in one_statement_on)

    def _read(self, work: Callable[[Connection], T]) -> T:
        return self.database.read(work)

    @property
    def dialect(self) -> str:
        return self.database.dialect

    def close(self) -> None:
        self.database.dispose()

    def migrate(self, revision: str = "head") -> None:
        """Bring the schema to ``revision`` with Alembic (safe to call from many processes)."""
        # Alembic is imported here: workers that never migrate do not pay for it at start-up.
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, revision)

    # --- Runs -----------------------------------------------------------------------------

    def register(self, identity: RunIdentity, params: dict[str, Any] | None = None) -> Run:
        """Create the Run as pending, or return the existing one (see ``register_txn``)."""
        return self._write(lambda c: rn.register_txn(c, identity, params),
                           one_statement_on=EVERYWHERE)

    def claim(self, run_id: str, owner: str, lease: timedelta | float) -> rn.Claim | None:
        """Take the Run's lease, or None if it is completed, failed or leased by someone else."""
        seconds = _lease_seconds(lease)
        return self._write(lambda c: rn.claim_txn(c, run_id, owner, seconds),
                           one_statement_on=ON_POSTGRES)

    def register_and_claim(
        self,
        identity: RunIdentity,
        params: dict[str, Any] | None = None,
        *,
        owner: str,
        lease: timedelta | float,
    ) -> rn.Registration:
        """Register the Run and take its lease in one statement (see ``register_and_claim_txn``);
        ``RunConflict`` if it exists with other parameters."""
        found = self.register_and_claim_many([(identity, params)], owner=owner, lease=lease)
        registration = found[identity.run_id]
        if registration.conflict is not None:
            raise registration.conflict
        return registration

    def register_and_claim_many(
        self,
        entries: Sequence[tuple[RunIdentity, dict[str, Any] | None]],
        *,
        owner: str,
        lease: timedelta | float,
    ) -> dict[str, rn.Registration]:
        """Register and claim many Runs in one statement, keyed by run id; a conflicting Run is
        reported in its Registration, not raised, so that the others proceed."""
        seconds = _lease_seconds(lease)
        for attempt in range(1, IDENTITY_RACE_TRIES + 1):
            try:
                return self._write(
                    lambda c: rn.register_and_claim_txn(c, entries, owner, seconds),
                    one_statement_on=ON_POSTGRES,
                )
            except sa.exc.IntegrityError as exc:
                if attempt == IDENTITY_RACE_TRIES or not _lost_identity_race(exc):
                    raise
        raise AssertionError("unreachable")

    def renew(self, claim: rn.Claim, lease: timedelta | float) -> datetime:
        """Extend the lease by ``lease`` from now (database clock); ``LeaseLost`` if stale."""
        seconds = _lease_seconds(lease)
        return self._write(lambda c: rn.renew_txn(c, claim, seconds), one_statement_on=EVERYWHERE)

    def renew_many(self, claims: Sequence[rn.Claim], lease: timedelta | float) -> dict[str, datetime]:
        """Extend many leases in one statement; the claims left out of the result are lost."""
        seconds = _lease_seconds(lease)
        return self._write(lambda c: rn.renew_many_txn(c, claims, seconds),
                           one_statement_on=EVERYWHERE)

    def save_input(self, claim: rn.Claim, raw: dict[str, Any]) -> dict[str, Any]:
        """Store the raw input once and return the stored one (the first writer's)."""
        raw = rn.json_document(raw, "raw input", self.max_output_bytes)
        return self._write(lambda c: rn.save_input_txn(c, claim, raw),
                           one_statement_on=EVERYWHERE)

    def complete(
        self,
        claim: rn.Claim,
        output: dict[str, Any],
        messages: Sequence[OutboxMessage] = (),
        effect: rn.Effect | None = None,
    ) -> Run:
        """Complete the Run (see ``complete_txn``); returns the stored Run either way."""
        return self.complete_run(claim, output, messages, effect).run

    def complete_run(
        self,
        claim: rn.Claim,
        output: dict[str, Any],
        messages: Sequence[OutboxMessage] = (),
        effect: rn.Effect | None = None,
    ) -> rn.Completion:
        """Like ``complete`` but also says whether this call completed the Run."""
        output = rn.json_document(output, "output", self.max_output_bytes)
        messages = list(messages)
        done = self._write(
            lambda c: rn.complete_txn(c, claim, output, messages, effect),
            one_statement_on=ON_POSTGRES if effect is None else frozenset(),
        )
        fault_point("after_complete_commit")
        return done

    def fail(self, claim: rn.Claim, error: str, retryable: bool = True) -> Run:
        """Record the error: retryable releases the lease, otherwise the Run is failed."""
        text = rn.error_text(error)
        return self._write(lambda c: rn.fail_txn(c, claim, text, retryable))

    def requeue_run(self, run_id: str) -> Run:
        return self._write(lambda c: rn.requeue_run_txn(c, run_id))

    def get(self, run_id: str) -> Run | None:
        return self._read(lambda c: rn.get_run(c, run_id))

    def require(self, run_id: str) -> Run:
        run = self.get(run_id)
        if run is None:
            raise RunNotFound(f"no run with id {run_id!r}")
        return run

    def resolve_run_id(self, prefix: str) -> str:
        """The id of the one Run whose id starts with ``prefix`` (see ``runs.resolve_id``)."""
        return self._read(lambda c: rn.resolve_id(c, rn.runs.c.run_id, prefix, "run",
                                                  RunNotFound))

    def get_many(self, run_ids: Sequence[str]) -> dict[str, Run]:
        return self._read(lambda c: rn.get_runs(c, run_ids))

    def finished(self, run_ids: Sequence[str]) -> dict[str, rn.FinishedRun]:
        """The completed and failed Runs among ``run_ids``, without their raw inputs."""
        return self._read(lambda c: rn.get_finished_runs(c, run_ids))

    def runs(self, *, job: str | None = None, status: str | None = None, limit: int = 100) -> list[Run]:
        return self._read(lambda c: rn.list_runs(c, job=job, status=status, limit=limit))

    def attempts(self, run_id: str) -> list[Attempt]:
        return self._read(lambda c: rn.list_attempts(c, run_id))

    # --- Outbox ---------------------------------------------------------------------------

    def claim_messages(
        self, owner: str, limit: int, lease: timedelta | float, channel: str | None = None
    ) -> list[ob.MessageClaim]:
        seconds = _lease_seconds(lease)
        return self._write(
            lambda c: ob.claim_messages_txn(c, owner, limit, seconds, channel),
            one_statement_on=ON_POSTGRES,
        )

    def mark_sent(self, claim: ob.MessageClaim, reply: ob.Reply = ob.NO_REPLY) -> None:
        self._write(lambda c: ob.mark_sent_txn(c, claim, reply), one_statement_on=ON_POSTGRES)

    def mark_sent_many(
        self, sent: Sequence[tuple[ob.MessageClaim, ob.Reply]]
    ) -> list[ob.MessageClaim]:
        """Mark several messages sent in one transaction; returns the claims whose lease was lost."""
        return self._write(lambda c: ob.mark_sent_many_txn(c, sent))

    def schedule_retry(
        self, claim: ob.MessageClaim, delay: float, error: str, reply: ob.Reply = ob.NO_REPLY
    ) -> None:
        self._write(lambda c: ob.schedule_retry_txn(c, claim, delay, error, reply),
                    one_statement_on=ON_POSTGRES)

    def mark_uncertain(
        self, claim: ob.MessageClaim, error: str, retry_in: float | None,
        reply: ob.Reply = ob.NO_REPLY,
    ) -> None:
        self._write(lambda c: ob.mark_uncertain_txn(c, claim, error, retry_in, reply),
                    one_statement_on=ON_POSTGRES)

    def mark_dead(self, claim: ob.MessageClaim, error: str, reply: ob.Reply = ob.NO_REPLY) -> None:
        self._write(lambda c: ob.mark_dead_txn(c, claim, error, reply),
                    one_statement_on=ON_POSTGRES)

    def release_message(self, claim: ob.MessageClaim) -> None:
        self._write(lambda c: ob.release_message_txn(c, claim), one_statement_on=ON_POSTGRES)

    def requeue_message(self, message_id: str) -> QueuedMessage:
        return self._write(lambda c: ob.requeue_message_txn(c, message_id),
                           one_statement_on=ON_POSTGRES)

    def message(self, message_id: str) -> QueuedMessage | None:
        return self._read(lambda c: ob.get_message(c, message_id))

    def resolve_message_id(self, prefix: str) -> str:
        """The id of the one outbox message whose id starts with ``prefix``."""
        return self._read(lambda c: rn.resolve_id(c, ob.outbox.c.message_id, prefix,
                                                  "outbox message", MessageNotFound))

    def messages(
        self, *, status: str | None = None, run_id: str | None = None, limit: int = 100
    ) -> list[QueuedMessage]:
        return self._read(lambda c: ob.list_messages(c, status=status, run_id=run_id, limit=limit))

    def delivery_attempts(self, message_id: str) -> list[DeliveryAttempt]:
        return self._read(lambda c: ob.list_delivery_attempts(c, message_id))

    def message_counts(self) -> dict[str, int]:
        return self._read(ob.count_messages)

    def db_now(self) -> datetime:
        """The database clock (what lease expiry is judged by)."""

        def read(conn: Connection) -> datetime:
            value = conn.execute(sa.select(db_clock())).scalar_one()
            return value  # type: ignore[no-any-return]

        return self._read(read)
