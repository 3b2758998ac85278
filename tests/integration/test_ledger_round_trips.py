"""Round trips per transition, counted at the driver on both ledgers: a transition declared one
statement (``@transition(one_statement_on=...)``) sends exactly one, with no BEGIN or COMMIT;
every other one sends its transaction's statements between a BEGIN and a COMMIT."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from store import Claim, Effect, Ledger, OutboxMessage, Reply, RunIdentity, revisions
from store import occurrences as oc
from store import outbox as ob
from store import registration as rg
from store import runs as rn
from store.statement import Transition
from tests.support.delivery import queue
from tests.support.ledger import register_and_claim
from tests.support.sql_trace import sent_statements

PERIOD = datetime(2026, 1, 5, 9, tzinfo=UTC)
BUSINESS = sa.MetaData()
sa.Table("credits", BUSINESS, sa.Column("run_id", sa.String(64), primary_key=True))


def _identity() -> RunIdentity:
    return RunIdentity("trips", f"s-{uuid.uuid4().hex[:8]}", PERIOD, "v1")


def _claimed(ledger: Ledger) -> Claim:
    claim = register_and_claim(ledger, _identity(), owner="w:1", lease=60).claim
    assert claim is not None
    return claim


def _stranded(ledger: Ledger) -> oc.RunState:
    """A Run released once by its worker (pending again): past a cap of one attempt."""
    claim = _claimed(ledger)
    ledger.fail(claim, "TimeoutError", retryable=True)
    [state] = [s for s in ledger.occurrences.run_states("trips", PERIOD) if s.run_id == claim.run_id]
    return state


def _overdue(ledger: Ledger) -> str:
    ledger.occurrences.mark_overdue([_identity()])
    return "trips"


def _dead_message_id(ledger: Ledger) -> str:
    """A queued message, claimed and marked dead: its id."""
    queue(ledger, 1)
    claim = ledger.outbox.claim_messages("d:1", 1, 60)[0]
    ledger.outbox.mark_dead(claim, "550 no")
    return claim.message_id


def _effect(claim: Claim) -> Effect:
    def credit(session: Session, output: dict[str, Any]) -> None:
        session.execute(sa.insert(BUSINESS.tables["credits"]).values(run_id=claim.run_id))
    return credit


# transition, how to prepare its arguments, the call, and the statements it sends between
# BEGIN and COMMIT when it is not one statement (SQLite sends its follow-ups separately).
Case = tuple[Transition[..., Any], Callable[[Ledger], Any], Callable[[Ledger, Any], Any],
             dict[str, int]]
CASES: dict[str, Case] = {
    "register": (rg.register_txn, lambda led: _identity(), lambda led, i: led.register(i), {}),
    "claim": (rg.claim_txn, lambda led: led.register(_identity()).run_id,
              lambda led, run_id: led.claim(run_id, "w:1", 60), {"sqlite": 3}),
    "register_and_claim": (rg.register_and_claim_txn, lambda led: _identity(),
                           lambda led, i: led.register_and_claim_many([(i, None)], owner="w:1",
                                                                      lease=60),
                           {"sqlite": 3}),
    "renew_many": (rn.renew_many_txn, _claimed, lambda led, c: led.renew_many([c], 60), {}),
    "save_input": (rn.save_input_txn, _claimed, lambda led, c: led.save_input(c, {"a": 1}), {}),
    "complete": (rn.complete_txn, _claimed,
                 lambda led, c: led.complete(c, {"s": 1}, [OutboxMessage("a@example.com", "s", "b")]),
                 {"sqlite": 3}),
    "complete with an effect": (
        rn.complete_with_effect_txn, _claimed,
        lambda led, c: led.complete(c, {"s": 1}, [OutboxMessage("a@example.com", "s", "b")],
                                    _effect(c)),
        {"postgresql": 2, "sqlite": 4}),
    "fail": (rn.fail_txn, _claimed, lambda led, c: led.fail(c, "boom", retryable=False),
             {"postgresql": 2, "sqlite": 2}),
    "requeue_run": (rn.requeue_run_txn,
                    lambda led: (c := _claimed(led), led.fail(c, "boom", retryable=False))[0].run_id,
                    lambda led, run_id: led.requeue_run(run_id), {"postgresql": 1, "sqlite": 1}),
    "take_over": (rn.take_over_txn, _claimed, lambda led, c: led.take_over(c.run_id),
                  {"postgresql": 2, "sqlite": 2}),
    "request_revision": (revisions.request_revision_txn,
                         lambda led: (c := _claimed(led), led.complete(c, {"s": 1}))[0].run_id,
                         lambda led, run_id: led.request_revision(run_id, "why"),
                         {"postgresql": 2, "sqlite": 2}),
    "give_up": (oc.give_up_txn, _stranded, lambda led, state: led.occurrences.give_up(state, 1),
                {"postgresql": 2, "sqlite": 2}),
    "claim_events": (oc.claim_events_txn, _overdue, lambda led, job: led.occurrences.claim_events(job, 60), {}),
    "mark_emitted": (oc.mark_emitted_txn, lambda led: led.occurrences.claim_events(_overdue(led), 60),
                     lambda led, claimed: led.occurrences.mark_emitted(claimed), {}),
    "claim_messages": (ob.claim_messages_txn, lambda led: queue(led, 2),
                       lambda led, _: led.outbox.claim_messages("d:1", 10, 60), {"sqlite": 2}),
    "mark_sent": (ob.mark_sent_txn, lambda led: (queue(led, 2), led.outbox.claim_messages("d:1", 10, 60))[1],
                  lambda led, claims: led.outbox.mark_sent([(c, Reply(250)) for c in claims]),
                  {"sqlite": 2}),
    "schedule_retry": (ob.schedule_retry_txn,
                       lambda led: (queue(led, 1), led.outbox.claim_messages("d:1", 1, 60)[0])[1],
                       lambda led, c: led.outbox.schedule_retry(c, 60, "451 later"), {"sqlite": 2}),
    "mark_uncertain": (ob.mark_uncertain_txn,
                       lambda led: (queue(led, 1), led.outbox.claim_messages("d:1", 1, 60)[0])[1],
                       lambda led, c: led.outbox.mark_uncertain(c, "lost", None), {"sqlite": 2}),
    "mark_dead": (ob.mark_dead_txn,
                  lambda led: (queue(led, 1), led.outbox.claim_messages("d:1", 1, 60)[0])[1],
                  lambda led, c: led.outbox.mark_dead(c, "550 no"), {"sqlite": 2}),
    "release_message": (ob.release_message_txn,
                        lambda led: (queue(led, 1), led.outbox.claim_messages("d:1", 1, 60)[0])[1],
                        lambda led, c: led.outbox.release_message(c), {"sqlite": 1}),
    "requeue_message": (ob.requeue_message_txn,
                        _dead_message_id,
                        lambda led, message_id: led.outbox.requeue_message(message_id), {"sqlite": 1}),
}


def _round_trips(ledger: Ledger, db_url: str, name: str) -> tuple[list[str], Case]:
    case = CASES[name]
    _, prepare, call, _ = case
    if name == "complete with an effect":
        BUSINESS.create_all(ledger.engine)
    with sent_statements() as sent:
        traced = Ledger.connect(db_url)  # opened inside, so its connections are traced
        try:
            # Open the connections first: their set-up queries are not the transition's.
            traced.get_many(["warm-up"])
            traced.database.write(lambda conn: None)
            given = prepare(traced)
            sent.clear()
            call(traced, given)
            trips = list(sent)
        finally:
            traced.close()
    return trips, case


@pytest.mark.parametrize("name", list(CASES))
def test_each_transition_sends_the_round_trips_it_declares(
        ledger: Ledger, db_url: str, name: str) -> None:
    """A transition declared one statement on this dialect sends one statement and no BEGIN
    or COMMIT; any other sends BEGIN, its statements, COMMIT."""
    trips, (txn, _, _, statements) = _round_trips(ledger, db_url, name)
    if ledger.dialect in txn.one_statement_on:
        assert len(trips) == 1 and not trips[0].startswith(("BEGIN", "COMMIT")), trips
        return
    assert trips[0].startswith("BEGIN") and trips[-1] == "COMMIT", trips
    assert len(trips) - 2 == statements[ledger.dialect], trips


def test_a_sent_mark_retried_after_its_commit_costs_one_read_more_and_no_transaction(
        ledger: Ledger, db_url: str) -> None:
    """mark_sent of claims already marked by themselves: the update matches nothing and one
    read finds the claim's own mark (PostgreSQL: still in autocommit, no BEGIN or COMMIT)."""
    with sent_statements() as sent:
        traced = Ledger.connect(db_url)
        try:
            traced.get_many(["warm-up"])
            traced.database.write(lambda conn: None)
            queue(traced, 2)
            claims = traced.outbox.claim_messages("d:1", 10, 60)
            assert traced.outbox.mark_sent([(c, Reply(250)) for c in claims]) == []
            sent.clear()
            assert traced.outbox.mark_sent([(c, Reply(250)) for c in claims]) == []
            trips = list(sent)
        finally:
            traced.close()
    if ledger.dialect == "postgresql":
        assert len(trips) == 2 and not any(t.startswith(("BEGIN", "COMMIT")) for t in trips), trips
    else:
        assert trips[0].startswith("BEGIN") and trips[-1] == "COMMIT" and len(trips) == 5, trips
