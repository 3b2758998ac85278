"""What a job owes and the decisions about it, on both ledgers: obligations keep their first
period, a skip is recorded only for an occurrence nobody started, an overdue occurrence and its
recovery are reported once each however many reconcilers ask, a stranded Run past its attempt
cap fails for good, and each decision's event is emitted by one pass at a time until recorded."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from store import Ledger, RunIdentity, unemitted
from store.occurrences import GAVE_UP
from tests.support.ledger import register_and_claim, wait_for_db_clock

DAY = datetime(2026, 1, 5, tzinfo=UTC)


def identity(subject: str = "acme", day: int = 0) -> RunIdentity:
    return RunIdentity("owed", subject, DAY + timedelta(days=day), "v1")


def test_a_subject_is_owed_from_the_first_period_recorded_for_it(ledger: Ledger) -> None:
    """A second owe with another period changes nothing for a known subject, adds a new one."""
    assert ledger.occurrences.owe("owed", {"acme": DAY}) == {"acme": DAY}
    later = DAY + timedelta(days=3)
    assert ledger.occurrences.owe("owed", {"acme": later, "globex": later}) == {"acme": DAY, "globex": later}
    assert ledger.occurrences.owe("other", {}) == {}


def test_only_an_occurrence_nobody_started_is_skipped_and_only_once(ledger: Ledger) -> None:
    """A Run of the identity means it is re-driven, not skipped; a second skip is no news."""
    started = identity("started")
    ledger.register(started)
    missed = identity("missed")
    assert ledger.occurrences.skip([(missed, "missed while nothing ran"), (started, "missed")]) == [
        missed.run_id]
    assert ledger.occurrences.skip([(missed, "again")]) == []
    [occurrence] = ledger.occurrences.list("owed", DAY)
    assert (occurrence.run_id, occurrence.skip_reason) == (missed.run_id, "missed while nothing ran")
    assert occurrence.skipped_at is not None
    assert ledger.occurrences.unskip([missed.run_id, started.run_id]) == [missed.run_id]
    assert ledger.occurrences.skip([(missed, "skipped again")]) == [missed.run_id]


def test_an_overdue_occurrence_is_reported_once_and_recovered_once(ledger: Ledger) -> None:
    """Overdue once (never for a completed or skipped one), recovered once after completion."""
    late, done, skipped = identity("late"), identity("done"), identity("skipped")
    claim = register_and_claim(ledger, done, owner="w:1", lease=60).claim
    assert claim is not None
    ledger.complete(claim, {"summary": "ok"})
    ledger.occurrences.skip([(skipped, "superseded by 2026-01-06")])
    assert ledger.occurrences.mark_overdue([late, done, skipped]) == [late.run_id]
    assert ledger.occurrences.mark_overdue([late]) == []
    assert ledger.occurrences.mark_recovered("owed") == []
    claim = register_and_claim(ledger, late, owner="w:1", lease=60).claim
    assert claim is not None
    ledger.complete(claim, {"summary": "late"})
    [recovered] = ledger.occurrences.mark_recovered("owed")
    assert recovered.run_id == late.run_id and recovered.recovered_at is not None
    assert ledger.occurrences.mark_recovered("owed") == []


def test_two_reconcilers_at_once_report_each_overdue_occurrence_once(
        ledger: Ledger, db_url: str) -> None:
    """Eight threads, each with its own ledger connection, report the same 20 occurrences."""
    late = [identity(f"s{i}") for i in range(20)]
    barrier = threading.Barrier(8)
    reported: list[str] = []
    lock = threading.Lock()

    def reconcile() -> None:
        own = Ledger.connect(db_url)
        try:
            barrier.wait()
            found = own.occurrences.mark_overdue(late)
            with lock:
                reported.extend(found)
        finally:
            own.close()

    threads = [threading.Thread(target=reconcile) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(reported) == sorted(i.run_id for i in late)


def test_a_stranded_run_past_its_attempt_cap_fails_for_good(ledger: Ledger) -> None:
    """Pending after three released attempts: with a cap of 3 it fails naming its last error;
    below the cap, or while another worker holds a live lease, nothing changes."""
    stranded = identity("stranded")
    for attempt in range(3):
        claim = register_and_claim(ledger, stranded, owner=f"w:{attempt}", lease=60).claim
        assert claim is not None
        ledger.fail(claim, f"TimeoutError: try {attempt}", retryable=True)
    [state] = ledger.occurrences.run_states("owed", DAY)
    assert state.stranded and state.attempts == 3 and not state.lease_expired
    assert not ledger.occurrences.give_up(state, max_attempts=4)
    assert ledger.occurrences.give_up(state, max_attempts=3)
    run = ledger.get(stranded.run_id)
    assert run.status == "failed"
    assert run.error == GAVE_UP.format(attempts=3, error="TimeoutError: try 2")
    assert not ledger.occurrences.give_up(state, max_attempts=3)  # failed already: not again
    [occurrence] = ledger.occurrences.list("owed", DAY)  # the decision, its event still to emit
    assert [kind for kind, _ in unemitted(occurrence)] == ["gave-up"]


def test_a_live_lease_is_not_stranded_and_never_given_up(ledger: Ledger) -> None:
    """A running Run on a lease that has not expired by the database clock is left alone."""
    live = identity("live")
    assert register_and_claim(ledger, live, owner="w:1", lease=600).claim is not None
    [state] = ledger.occurrences.run_states("owed", DAY)
    assert state.status == "running" and not state.lease_expired and not state.stranded
    assert not ledger.occurrences.give_up(state, max_attempts=1)
    assert ledger.get(live.run_id).status == "running"


def test_a_decisions_event_is_emitted_by_one_pass_at_a_time_until_recorded_emitted(
        ledger: Ledger) -> None:
    """A decision is claimable until recorded emitted; a live claim keeps other passes off, an
    expired one (its pass died) lets the next pass emit it; a skip made again after an unskip
    is a new decision to emit."""
    late, missed = identity("late"), identity("missed")
    ledger.occurrences.mark_overdue([late])
    ledger.occurrences.skip([(missed, "missed")])
    claimed = ledger.occurrences.claim_events("owed", 0.2)
    assert sorted(o.run_id for o in claimed) == sorted([late.run_id, missed.run_id])
    assert ledger.occurrences.claim_events("owed", 60) == []  # held by the first pass
    until = max(o.emitting_until for o in claimed if o.emitting_until is not None)
    wait_for_db_clock(ledger, until)
    again = ledger.occurrences.claim_events("owed", 60)  # the first pass died: its lease ran out
    assert {o.run_id for o in again} == {late.run_id, missed.run_id}
    ledger.occurrences.mark_emitted(again)
    assert ledger.occurrences.claim_events("owed", 60) == []
    assert not any(unemitted(o) for o in ledger.occurrences.list("owed", DAY))
    ledger.occurrences.unskip([missed.run_id])
    ledger.occurrences.skip([(missed, "missed again")])
    [skipped] = ledger.occurrences.claim_events("owed", 60)
    assert [k for k, _ in unemitted(skipped)] == ["skipped"]
