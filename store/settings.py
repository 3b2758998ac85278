"""Ledger settings from the environment (RUNLEDGER_*)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from store.database import (
    DEFAULT_REACH,
    POSTGRES_LOCK_TIMEOUT_MS,
    SQLITE_BUSY_TIMEOUT_MS,
    SQLITE_LOCKED_RETRIES,
    SQLITE_SYNCHRONOUS,
    Reach,
    SQLiteSynchronous,
)

DEFAULT_DATABASE_URL = "sqlite:///./runledger.db"


class LedgerSettings(BaseSettings):
    """Where the ledger lives, how large a stored document may be, how long a writer
    waits for a lock (SQLite's write lock, a PostgreSQL row or table lock) before the ledger
    reports ``LedgerBusy``, how soon a PostgreSQL server that stopped answering is given up on,
    and whether a SQLite commit waits for the disk."""

    def reach(self) -> Reach:
        """The PostgreSQL client timeouts these settings name."""
        return Reach(self.postgres_connect_timeout_s, self.postgres_keepalives_idle_s,
                     self.postgres_keepalives_interval_s, self.postgres_keepalives_count,
                     self.postgres_tcp_user_timeout_ms)

    model_config = SettingsConfigDict(env_prefix="RUNLEDGER_", extra="ignore")

    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        description="The ledger's SQLAlchemy URL: ``sqlite:///path`` (one host) or "
                    "``postgresql+psycopg://user:password@host:port/db`` (many hosts).")
    max_output_bytes: int = Field(
        default=1_000_000, gt=0,
        description="Largest raw input or output document a Run may store, in bytes of JSON.")
    sqlite_busy_timeout_ms: int = Field(
        default=SQLITE_BUSY_TIMEOUT_MS, ge=0,
        description="SQLite: how long one try waits for the write lock (busy timeout).")
    sqlite_locked_retries: int = Field(
        default=SQLITE_LOCKED_RETRIES, ge=0,
        description="SQLite: tries after the first when the database is locked, before "
                    "``LedgerBusy``.")
    postgres_lock_timeout_ms: int = Field(
        default=POSTGRES_LOCK_TIMEOUT_MS, ge=0,
        description="PostgreSQL: ``lock_timeout`` of the ledger's connections; a lock held "
                    "longer makes the transition ``LedgerBusy`` (0 waits without limit).")
    postgres_connect_timeout_s: int = Field(
        default=DEFAULT_REACH.connect_timeout_s, ge=0,
        description="PostgreSQL: seconds a new connection may take (libpq ``connect_timeout``; "
                    "0 waits without limit).")
    postgres_keepalives_idle_s: int = Field(
        default=DEFAULT_REACH.keepalives_idle_s, ge=0,
        description="PostgreSQL: seconds of silence on a connection before a TCP keepalive "
                    "probe (0: the system's default).")
    postgres_keepalives_interval_s: int = Field(
        default=DEFAULT_REACH.keepalives_interval_s, ge=0,
        description="PostgreSQL: seconds between unanswered keepalive probes (0: the system's "
                    "default).")
    postgres_keepalives_count: int = Field(
        default=DEFAULT_REACH.keepalives_count, ge=0,
        description="PostgreSQL: unanswered keepalive probes after which the connection is "
                    "dead (0: the system's default).")
    postgres_tcp_user_timeout_ms: int = Field(
        default=DEFAULT_REACH.tcp_user_timeout_ms, ge=0,
        description="PostgreSQL: how long data sent may stay unacknowledged before the "
                    "connection is dead (``tcp_user_timeout``; 0: the system's default, about "
                    "15 minutes). A worker cut off from the database then notices within this "
                    "time instead of waiting on a dead connection while its leases expire.")
    sqlite_synchronous: SQLiteSynchronous = Field(
        default=SQLITE_SYNCHRONOUS,
        description="SQLite commit mode: ``normal`` (a process crash loses no commit, a power "
                    "cut may lose the last ones) or ``full`` (the WAL is synced at every commit).")

    @field_validator("sqlite_synchronous", mode="before")
    @classmethod
    def _lower_case(cls, value: Any) -> Any:
        # SQLite spells the modes in upper case (PRAGMA synchronous=FULL): accept both.
        return value.lower() if isinstance(value, str) else value
