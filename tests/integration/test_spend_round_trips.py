"""Round trips of the model call transitions and of one Run with one model call, counted at
the driver on both ledgers: recording a call adds two round trips per call to a Run's three
(register+claim, save input, complete), five in all on PostgreSQL; a replay one."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from flows.model import EndpointLimiter
from store import Claim, Intent, Ledger, Limits, RunIdentity, Usage
from tests.support.sql_trace import sent_statements

PERIOD = datetime(2026, 1, 5, 9, tzinfo=UTC)
DIGEST = "2" * 64


def _one_run(ledger: Ledger) -> Claim:
    """The ledger calls of one Run's stages with one model call, as a tick makes them."""
    identity = RunIdentity("trips", f"s-{uuid.uuid4().hex[:8]}", PERIOD, "v1")
    claim = ledger.register_and_claim_many([(identity, None)], owner="w:1", lease=60)[
        identity.run_id].claim
    assert claim is not None
    ledger.save_input(claim, {"text": "x"})
    call = ledger.calls.record_intent(claim, Intent("offline", "m", 0, DIGEST))
    ledger.calls.record_answer(call, {"text": "y"}, Usage(3, 1, 1))
    ledger.complete(claim, {"text": "y"})
    return claim


def _traced(db_url: str, work: object) -> list[str]:
    with sent_statements() as sent:
        traced = Ledger.connect(db_url)
        try:
            traced.get_many(["warm-up"])
            traced.database.write(lambda conn: None)
            sent.clear()
            work(traced)  # type: ignore[operator]
            return list(sent)
        finally:
            traced.close()


def test_a_run_with_one_model_call_costs_five_round_trips_on_postgresql(db_url: str) -> None:
    """register+claim, save input, call intent, call answer and checkpoint, complete: five
    statements on PostgreSQL (no BEGIN or COMMIT); SQLite adds its transactions' own."""
    trips = _traced(db_url, _one_run)
    if db_url.startswith("postgresql"):
        assert len(trips) == 5 and not any(t.startswith(("BEGIN", "COMMIT")) for t in trips), trips
    else:
        writes = [t for t in trips if not t.startswith(("BEGIN", "COMMIT"))]
        # register+claim and complete each add their Attempt (and outbox) follow-ups.
        calls = [t for t in writes if t.startswith(("INSERT INTO model_calls",
                                                    "UPDATE model_calls"))]
        assert len(calls) == 2, trips


@pytest.mark.parametrize("step", ["intent", "answer", "failure", "replay"])
def test_each_call_transition_without_a_budget_is_one_statement(db_url: str, step: str) -> None:
    """Recording an intent, an answer, a failure or a replay sends one statement, no
    transaction, on both dialects."""
    def work(ledger: Ledger) -> None:
        claim = _one_run(ledger) if step == "replay" else None
        identity = RunIdentity("trips", f"t-{uuid.uuid4().hex[:8]}", PERIOD, "v1")
        held = ledger.register_and_claim_many([(identity, None)], owner="w:1", lease=60)[
            identity.run_id].claim
        assert held is not None
        call = None if step == "intent" else ledger.calls.record_intent(
            held, Intent("offline", "m", 0, DIGEST))
        ledger.database.write(lambda conn: None)
        sent_before = len(recorded)
        if step == "intent":
            ledger.calls.record_intent(held, Intent("offline", "m", 0, DIGEST))
        elif step == "answer":
            assert call is not None
            ledger.calls.record_answer(call, {"text": "y"}, Usage(1, 1))
        elif step == "failure":
            assert call is not None
            ledger.calls.record_failure(call, "refused", "HTTP 429")
        else:
            assert claim is not None
            ledger.calls.replay(held, 0, DIGEST)
        counted.extend(recorded[sent_before:])

    counted: list[str] = []
    recorded: list[str] = []
    with sent_statements() as sent:
        recorded = sent
        traced = Ledger.connect(db_url)
        try:
            traced.get_many(["warm-up"])
            work(traced)
        finally:
            traced.close()
    assert len(counted) == 1 and not counted[0].startswith(("BEGIN", "COMMIT")), counted


def _limited_call(bounds_in_flight: bool) -> Callable[[Ledger], None]:
    """One call through the limiter of an endpoint limited to 6,000 requests a minute, with
    or without a bound on its calls in flight."""
    def work(ledger: Ledger) -> None:
        identity = RunIdentity("trips", f"l-{uuid.uuid4().hex[:8]}", PERIOD, "v1")
        claim = ledger.register_and_claim_many([(identity, None)], owner="w:1", lease=60)[
            identity.run_id].claim
        assert claim is not None
        ledger.calls.configure_endpoint(
            "ep", Limits(requests_per_minute=6_000, max_concurrent=8 if bounds_in_flight else None))
        limiter = EndpointLimiter(ledger.calls, "ep", in_flight_seconds=60,
                                  max_pause_seconds=60, bounds_in_flight=bounds_in_flight)
        call = limiter.record(claim, Intent("ep", "m", 0, DIGEST), 40)
        assert call.slot is not None and call.slot.endpoint == "ep"

    return work


def _transactions(trips: list[str]) -> list[list[str]]:
    """The statements grouped by the transaction they were sent in (one each outside one)."""
    groups: list[list[str]] = []
    open_one: list[str] | None = None
    for trip in trips:
        if trip.startswith("BEGIN"):
            open_one = []
        elif trip.startswith(("COMMIT", "ROLLBACK")):
            if open_one:
                groups.append(open_one)
            open_one = None
        elif open_one is not None:
            open_one.append(trip)
        else:
            groups.append([trip])
    return groups


@pytest.mark.parametrize("bounds_in_flight", [False, True], ids=["unbounded", "bounded"])
def test_a_limited_call_holds_its_endpoints_row_across_round_trips_only_when_in_flight_is_bounded(
        db_url: str, bounds_in_flight: bool) -> None:
    """Without a bound on calls in flight the slot is one statement and the call's record
    another, each a transaction of its own: the endpoint's row is never held while the
    worker waits for the network. With one, slot and record are one transaction (the count
    must include every call recorded before); on PostgreSQL it locks the row first."""
    trips = _traced(db_url, _limited_call(bounds_in_flight))
    writes = [g for g in _transactions(trips)
              if any(t.startswith(("UPDATE endpoint_limits", "INSERT INTO model_calls"))
                     for t in g)]
    slots = [g for g in writes if any(t.startswith("UPDATE endpoint_limits") for t in g)]
    assert len(slots) == 1, trips
    together = any(t.startswith("INSERT INTO model_calls") for t in slots[0])
    assert together is bounds_in_flight, writes
    if not bounds_in_flight:
        assert [len(g) for g in writes] == [1, 1], writes
    elif db_url.startswith("postgresql"):
        assert [t.split()[0] for t in slots[0]] == ["SELECT", "UPDATE", "INSERT"], slots
