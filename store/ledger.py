"""The Ledger: the durable authority for Runs and their outbox. Each public method is one unit
of work (one transaction) around one transition from ``store.runs`` or ``store.outbox``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection, Engine

from store import outbox as ob
from store import runs as rn
from store.dialect import create_engine, run_read, run_write
from store.dialect import db_now as db_clock
from store.errors import InvalidInput, RunNotFound
from store.faults import fault_point
from store.identity import RunIdentity
from store.message import OutboxMessage
from store.models import Attempt, DeliveryAttempt, QueuedMessage, Run
from store.settings import LedgerSettings

MIGRATIONS = Path(__file__).with_name("migrations")


def _lease_seconds(lease: timedelta | float) -> float:
    value = lease.total_seconds() if isinstance(lease, timedelta) else float(lease)
    if value <= 0:
        raise InvalidInput(f"lease must be positive, got {lease!r}")
    return value


class Ledger:
    """Runs, attempts and outbox messages on PostgreSQL (many hosts) or SQLite (one host)."""

    def __init__(self, engine: Engine, *, max_output_bytes: int = 1_000_000) -> None:
        self.engine = engine
        self.max_output_bytes = max_output_bytes

    @classmethod
    def connect(cls, url: str | None = None, *, max_output_bytes: int | None = None) -> Ledger:
        """Open the ledger at ``url`` (default: $RUNLEDGER_DATABASE_URL, else ./runledger.db)."""
        settings = LedgerSettings()
        return cls(
            create_engine(url or settings.database_url),
            max_output_bytes=max_output_bytes or settings.max_output_bytes,
        )

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    def migrate(self, revision: str = "head") -> None:
        """Bring the schema to ``revision`` with Alembic (safe to call from many processes)."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, revision)

    # --- Runs -----------------------------------------------------------------------------

    def register(self, identity: RunIdentity, params: dict[str, Any] | None = None) -> Run:
        return run_write(self.engine, lambda c: rn.register_txn(c, identity, params),
                         autocommit=True)

    def claim(self, run_id: str, owner: str, lease: timedelta | float) -> rn.Claim | None:
        seconds = _lease_seconds(lease)
        return run_write(self.engine, lambda c: rn.claim_txn(c, run_id, owner, seconds),
                         autocommit=True)

    def renew(self, claim: rn.Claim, lease: timedelta | float) -> datetime:
        seconds = _lease_seconds(lease)
        return run_write(self.engine, lambda c: rn.renew_txn(c, claim, seconds), autocommit=True)

    def save_input(self, claim: rn.Claim, raw: dict[str, Any]) -> dict[str, Any]:
        raw = rn.json_document(raw, "raw input", self.max_output_bytes)
        return run_write(self.engine, lambda c: rn.save_input_txn(c, claim, raw), autocommit=True)

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
        done = run_write(
            self.engine, lambda c: rn.complete_txn(c, claim, output, messages, effect),
            autocommit=effect is None,
        )
        fault_point("after_complete_commit")
        return done

    def fail(self, claim: rn.Claim, error: str, retryable: bool = True) -> Run:
        return run_write(self.engine, lambda c: rn.fail_txn(c, claim, error, retryable))

    def requeue_run(self, run_id: str) -> Run:
        return run_write(self.engine, lambda c: rn.requeue_run_txn(c, run_id))

    def get(self, run_id: str) -> Run | None:
        return run_read(self.engine, lambda c: rn.get_run(c, run_id))

    def require(self, run_id: str) -> Run:
        run = self.get(run_id)
        if run is None:
            raise RunNotFound(f"no run with id {run_id!r}")
        return run

    def get_many(self, run_ids: Sequence[str]) -> dict[str, Run]:
        return run_read(self.engine, lambda c: rn.get_runs(c, run_ids))

    def runs(self, *, job: str | None = None, status: str | None = None, limit: int = 100) -> list[Run]:
        return run_read(self.engine, lambda c: rn.list_runs(c, job=job, status=status, limit=limit))

    def attempts(self, run_id: str) -> list[Attempt]:
        return run_read(self.engine, lambda c: rn.list_attempts(c, run_id))

    # --- Outbox ---------------------------------------------------------------------------

    def claim_messages(
        self, owner: str, limit: int, lease: timedelta | float, channel: str | None = None
    ) -> list[ob.MessageClaim]:
        seconds = _lease_seconds(lease)
        return run_write(
            self.engine, lambda c: ob.claim_messages_txn(c, owner, limit, seconds, channel),
            autocommit=True,
        )

    def mark_sent(self, claim: ob.MessageClaim, reply: ob.Reply = ob.NO_REPLY) -> None:
        run_write(self.engine, lambda c: ob.mark_sent_txn(c, claim, reply), autocommit=True)

    def schedule_retry(
        self, claim: ob.MessageClaim, delay: float, error: str, reply: ob.Reply = ob.NO_REPLY
    ) -> None:
        run_write(self.engine, lambda c: ob.schedule_retry_txn(c, claim, delay, error, reply),
                  autocommit=True)

    def mark_uncertain(
        self, claim: ob.MessageClaim, error: str, retry_in: float | None,
        reply: ob.Reply = ob.NO_REPLY,
    ) -> None:
        run_write(self.engine,
                  lambda c: ob.mark_uncertain_txn(c, claim, error, retry_in, reply),
                  autocommit=True)

    def mark_dead(self, claim: ob.MessageClaim, error: str, reply: ob.Reply = ob.NO_REPLY) -> None:
        run_write(self.engine, lambda c: ob.mark_dead_txn(c, claim, error, reply), autocommit=True)

    def release_message(self, claim: ob.MessageClaim) -> None:
        run_write(self.engine, lambda c: ob.release_message_txn(c, claim), autocommit=True)

    def requeue_message(self, message_id: str) -> QueuedMessage:
        return run_write(self.engine, lambda c: ob.requeue_message_txn(c, message_id),
                         autocommit=True)

    def message(self, message_id: str) -> QueuedMessage | None:
        return run_read(self.engine, lambda c: ob.get_message(c, message_id))

    def messages(
        self, *, status: str | None = None, run_id: str | None = None, limit: int = 100
    ) -> list[QueuedMessage]:
        return run_read(
            self.engine, lambda c: ob.list_messages(c, status=status, run_id=run_id, limit=limit)
        )

    def delivery_attempts(self, message_id: str) -> list[DeliveryAttempt]:
        return run_read(self.engine, lambda c: ob.list_delivery_attempts(c, message_id))

    def message_counts(self) -> dict[str, int]:
        return run_read(self.engine, ob.count_messages)

    def db_now(self) -> datetime:
        """The database clock (what lease expiry is judged by)."""

        def read(conn: Connection) -> datetime:
            value = conn.execute(sa.select(db_clock())).scalar_one()
            return value  # type: ignore[no-any-return]

        return run_read(self.engine, read)
