"""Round trips of the model call transitions and of one Run with one model call, counted at
the driver on both ledgers: recording a call adds two round trips per call to a Run's three
(register+claim, save input, complete), five in all on PostgreSQL; a replay one."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from store import Claim, Ledger, RunIdentity
from store.model_calls import Intent, Usage
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
