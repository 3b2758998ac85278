"""Ledger settings from the environment (RUNLEDGER_*)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite:///./runledger.db"


class LedgerSettings(BaseSettings):
    """Where the ledger lives and how large a stored document may be."""

    model_config = SettingsConfigDict(env_prefix="RUNLEDGER_", extra="ignore")

    database_url: str = DEFAULT_DATABASE_URL
    max_output_bytes: int = 1_000_000
