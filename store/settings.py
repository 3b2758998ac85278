"""Ledger settings from the environment (RUNLEDGER_*)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from store.dialect import POSTGRES_LOCK_TIMEOUT_MS, SQLITE_BUSY_TIMEOUT_MS, SQLITE_LOCKED_RETRIES

DEFAULT_DATABASE_URL = "sqlite:///./runledger.db"


class LedgerSettings(BaseSettings):
    """Where the ledger lives, how large a stored document may be, and how long a writer
    waits for a lock (SQLite's write lock, a PostgreSQL row or table lock) before the ledger
    reports ``LedgerBusy``."""

    model_config = SettingsConfigDict(env_prefix="RUNLEDGER_", extra="ignore")

    database_url: str = DEFAULT_DATABASE_URL
    max_output_bytes: int = Field(default=1_000_000, gt=0)
    sqlite_busy_timeout_ms: int = Field(default=SQLITE_BUSY_TIMEOUT_MS, ge=0)
    sqlite_locked_retries: int = Field(default=SQLITE_LOCKED_RETRIES, ge=0)
    postgres_lock_timeout_ms: int = Field(default=POSTGRES_LOCK_TIMEOUT_MS, ge=0)
