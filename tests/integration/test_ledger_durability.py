"""When a commit the ledger reports is on disk: on PostgreSQL before each completion returns;
on SQLite at the next checkpoint by default (WAL with synchronous=NORMAL: a process crash
loses nothing, a power cut can roll back the last commits), before each commit returns with
RUNLEDGER_SQLITE_SYNCHRONOUS=full."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from store import Claim, InvalidInput, Ledger, OutboxMessage, RunIdentity
from store.settings import LedgerSettings

RUNS = 30


def claims(ledger: Ledger) -> list[Claim]:
    start = datetime(2026, 3, 1, tzinfo=UTC)
    found = ledger.register_and_claim_many(
        [(RunIdentity("durability", f"s{i}", start, "1"), None) for i in range(RUNS)],
        owner="host:1", lease=900)
    return [r.claim for r in found.values() if r.claim is not None]


def complete(ledger: Ledger, held: list[Claim]) -> None:
    for claim in held:
        assert ledger.complete(claim, {"summary": claim.run_id},
                                   [OutboxMessage("ops@example.com", "done", claim.run_id)]).new


def commit_mode(ledger: Ledger) -> str:
    """PostgreSQL's commit mode on the connection the ledger writes with ("on": a commit returns
    once its WAL is synced to disk)."""
    return str(ledger.database.write(
        lambda c: c.exec_driver_sql("SHOW synchronous_commit").scalar_one()))


def synchronous(ledger: Ledger) -> int:
    """SQLite's commit mode on the connection the ledger writes with (1 NORMAL, 2 FULL)."""
    return int(ledger.database.write(
        lambda c: c.exec_driver_sql("PRAGMA synchronous").scalar_one(), single_statement=True))


def test_every_completion_is_on_disk_when_the_ledger_returns_with_sqlite_set_to_full(
        db_url: str) -> None:
    """PostgreSQL: the ledger writes with synchronous_commit on, so each completion's WAL is on
    disk before it returns (the SQLite setting does not apply). SQLite with "full": the ledger's
    write connections sync their WAL at every commit."""
    ledger = Ledger.connect(db_url, sqlite_synchronous="full")
    try:
        held = claims(ledger)
        if ledger.dialect == "sqlite":
            assert synchronous(ledger) == 2
            complete(ledger, held)
            assert synchronous(ledger) == 2
            return
        with ledger.engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW fsync").scalar_one() == "on", \
                "this test needs a PostgreSQL with fsync on"
        # The mode, not a count of WAL syncs: under other sessions' load one sync can cover
        # several commits, so a count proves nothing either way.
        assert commit_mode(ledger) == "on"
        complete(ledger, held)
        assert commit_mode(ledger) == "on"
    finally:
        ledger.close()


@pytest.mark.parametrize("given", ["full", "FULL"])
def test_sqlite_syncs_at_checkpoints_by_default_and_at_every_commit_when_set_to_full(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str) -> None:
    """RUNLEDGER_SQLITE_SYNCHRONOUS takes either case (SQLite spells the modes in upper case);
    the argument of Ledger.connect wins over the environment."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.delenv("RUNLEDGER_SQLITE_SYNCHRONOUS", raising=False)
    default = Ledger.connect(url)
    try:
        default.migrate()
        assert synchronous(default) == 1
    finally:
        default.close()
    monkeypatch.setenv("RUNLEDGER_SQLITE_SYNCHRONOUS", given)
    ledger = Ledger.connect(url)
    try:
        assert synchronous(ledger) == 2
        complete(ledger, claims(ledger))
    finally:
        ledger.close()
    explicit = Ledger.connect(url, sqlite_synchronous="normal")
    try:
        assert synchronous(explicit) == 1
    finally:
        explicit.close()


def test_an_unknown_sqlite_commit_mode_is_refused_by_name_and_nothing_is_created(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RUNLEDGER_SQLITE_SYNCHRONOUS", "off")
    with pytest.raises(ValidationError, match="sqlite_synchronous"):
        LedgerSettings()
    monkeypatch.delenv("RUNLEDGER_SQLITE_SYNCHRONOUS")
    with pytest.raises(InvalidInput, match="sqlite_synchronous must be 'full' or 'normal'"):
        Ledger.connect(f"sqlite:///{tmp_path / 'ledger.db'}", sqlite_synchronous="off")  # type: ignore[arg-type]
    assert not (tmp_path / "ledger.db").exists()
