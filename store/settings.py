"""Ledger settings from the environment (RUNLEDGER_*)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from store.database import (
    POSTGRES_LOCK_TIMEOUT_MS,
    SQLITE_BUSY_TIMEOUT_MS,
    SQLITE_LOCKED_RETRIES,
    SQLITE_SYNCHRONOUS,
    SQLiteSynchronous,
)

DEFAULT_DATABASE_URL = "sqlite:///./runledger.db"


class LedgerSettings(BaseSettings):
    """Where the ledger lives, how large a stored document may be, how long a writer
    waits for a lock (SQLite's write lock, a PostgreSQL row or table lock) before the ledger
    reports ``LedgerBusy``, and whether a SQLite commit waits for the disk."""

    model_config = SettingsConfigDict(env_prefix="RUNLEDGER_", extra="ignore")

    database_url: str = DEFAULT_DATABASE_URL
    max_output_bytes: int = Field(default=1_000_000, gt=0)
    sqlite_busy_timeout_ms: int = Field(default=SQLITE_BUSY_TIMEOUT_MS, ge=0)
    sqlite_locked_retries: int = Field(default=SQLITE_LOCKED_RETRIES, ge=0)
    postgres_lock_timeout_ms: int = Field(default=POSTGRES_LOCK_TIMEOUT_MS, ge=0)
    sqlite_synchronous: SQLiteSynchronous = SQLITE_SYNCHRONOUS

    @field_validator("sqlite_synchronous", mode="before")
    @classmethod
    def _lower_case(cls, value: Any) -> Any:
        # SQLite spells the modes in upper case (PRAGMA synchronous=FULL): accept both.
        return value.lower() if isinstance(value, str) else value
