"""daily-credit: once a day, credit each account a fixed number of units.

The business effect is a row in this job's own ``credits`` table, written in the same
transaction that completes the Run: a retry, an overlap or a rerun of the same day finds the
Run completed and credits nothing more. No model is called."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

from pydantic import Field as Setting
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.orm import registry
from sqlmodel import Field, Session, SQLModel, func, select

from flows.jobs import Candidate, Job, Model, OutboxMessage, Period, ValidationFailed


class DailyCreditSettings(BaseSettings):
    """Which accounts are credited, how many units, and in which timezone a day is counted."""

    model_config = SettingsConfigDict(env_prefix="RUNLEDGER_DAILY_CREDIT_", extra="ignore")

    accounts: str = Setting(default="account-1,account-2",
                            description="Comma-separated accounts (the subjects).")
    units: int = Setting(default=10, description="Units credited per account and day.")
    timezone: str = Setting(default="UTC", description="IANA zone a day is counted in.")


def _settings() -> DailyCreditSettings:
    return DailyCreditSettings()


class CreditTables(SQLModel, registry=registry()):
    """Business tables of this job: their own metadata, so the ledger's migrations ignore them."""


class Credit(CreditTables, table=True):
    """One credit per account and day; the key is a second guard besides the ledger."""

    __tablename__ = "credits"

    account: str = Field(primary_key=True, max_length=200)
    day: date = Field(primary_key=True)
    units: int


def accounts() -> list[str]:
    return [a.strip() for a in _settings().accounts.split(",") if a.strip()]


def collect(account: str, period: Period) -> dict[str, Any]:
    return {"account": account, "day": period.label, "units": _settings().units}


def transform(raw: dict[str, Any], model: Model) -> Candidate:
    text = f"credit {raw['units']} units to {raw['account']} for {raw['day']}"
    return Candidate(text, "none", dict(raw))


def validate(candidate: Candidate) -> None:
    if candidate.data["units"] <= 0:
        raise ValidationFailed(f"a credit must be positive, got {candidate.data['units']} units")


def messages(account: str, period: Period, output: dict[str, Any]) -> list[OutboxMessage]:
    return []


def effect(session: Session, output: dict[str, Any]) -> None:
    session.add(Credit(account=output["account"], day=date.fromisoformat(output["day"]),
                       units=output["units"]))


def params(account: str, period: Period) -> dict[str, Any]:
    """The amount shapes the Run: the same day with another amount is a conflict."""
    return {"units": _settings().units}


def balance(session: Session, account: str) -> int:
    """The account's credited units so far."""
    total = session.exec(select(func.sum(Credit.units)).where(Credit.account == account)).one()
    return int(total or 0)


job = Job(
    name="daily-credit",
    version="1",
    cadence="daily",
    timezone=_settings().timezone,
    subjects=accounts,
    collect=collect,
    transform=transform,
    validate=validate,
    messages=messages,
    effect=effect,
    params=params,
    tables=CreditTables.metadata,
    # Money: every day owed is credited, however long nothing ran (a missed day runs late, never
    # skipped).
    missed_runs="catch-up",
    due=timedelta(minutes=5),  # deployments/prefect.yaml: 00:05 in the job's timezone
    description="Credit each account a fixed number of units once a day, never twice.",
)
