"""The ledger's occurrences (``Ledger.occurrences``): what each job owes, the decisions recorded
about each owed occurrence (skipped, overdue, recovered, given up) and their events. Each method
is one unit of work around one transition or read of ``store.occurrences``, a transition
followed by its fault point."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from datetime import datetime, timedelta

from store import faults
from store.identity import RunIdentity
from store.models import Occurrence
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
from store.units_of_work import UnitsOfWork
from store.validators import lease_seconds


class OccurrenceBook:
    """What each job owes and the durable decisions about its owed occurrences, read and
    written by reconcile, a stale tick and backfill (``Ledger.occurrences``)."""

    def __init__(self, ledger: UnitsOfWork) -> None:
        self._ledger = ledger

    def owe(self, job: str, owed_from: dict[str, datetime]) -> dict[str, datetime]:
        """Record from which period ``job`` owes each subject not recorded yet; every recorded
        subject of the job with its period (see ``owe_txn``)."""
        return self._ledger._write(faults.AFTER_OWE_COMMIT, owe_txn, job, owed_from)

    def obligations(self, job: str) -> dict[str, datetime]:
        """Every subject ``job`` owes, with the period it is owed from."""
        return self._ledger._read(read_obligations, job)

    def skip(self, skipped: Sequence[tuple[RunIdentity, str]]) -> list[str]:
        """Record occurrences skipped by the missed-run policy, with their reasons (never one
        that has a Run); the run ids newly skipped."""
        return self._ledger._write(faults.AFTER_SKIP_COMMIT, skip_txn, skipped)

    def unskip(self, run_ids: Sequence[str]) -> list[str]:
        """Clear the skip of occurrences an operator runs on purpose; the run ids cleared."""
        return self._ledger._write(faults.AFTER_UNSKIP_COMMIT, unskip_txn, run_ids)

    def mark_overdue(self, identities: Sequence[RunIdentity]) -> list[str]:
        """Report occurrences overdue once each; the run ids reported by this call."""
        return self._ledger._write(faults.AFTER_MARK_OVERDUE_COMMIT, mark_overdue_txn,
                                   identities)

    def mark_recovered(self, job: str) -> list[Occurrence]:
        """Report once each overdue occurrence of ``job`` whose Run completed since."""
        return self._ledger._write(faults.AFTER_MARK_RECOVERED_COMMIT, mark_recovered_txn, job)

    def give_up(self, run: RunState, max_attempts: int) -> bool:
        """Fail a stranded Run past ``max_attempts`` for good, recorded on its occurrence (see
        ``give_up_txn``)."""
        return self._ledger._write(faults.AFTER_GIVE_UP_COMMIT, give_up_txn, run, max_attempts)

    def claim_events(self, job: str, lease: timedelta | float) -> list[Occurrence]:
        """Lease the occurrences of ``job`` whose decisions' events are not known to be emitted
        (see ``claim_events_txn``); emit them, then ``mark_emitted``."""
        return self._ledger._write(faults.AFTER_CLAIM_EVENTS_COMMIT, claim_events_txn,
                                   job, lease_seconds(lease))

    def mark_emitted(self, claimed: Sequence[Occurrence]) -> None:
        """Record the claimed occurrences' unemitted decisions' events as emitted."""
        self._ledger._write(faults.AFTER_MARK_EMITTED_COMMIT, mark_emitted_txn, claimed)

    def run_states(self, job: str, since: datetime) -> list[RunState]:
        """Where each Run of ``job`` from period ``since`` on stands, oldest first."""
        return self._ledger._read(run_states, job, since)

    # Last, and annotated with the builtin by name: once this method is defined, ``list`` in
    # the class body is the method.
    def list(self, job: str, since: datetime) -> builtins.list[Occurrence]:
        """The recorded occurrences (skips, alerts) of ``job`` from period ``since`` on."""
        return self._ledger._read(list_occurrences, job, since)
