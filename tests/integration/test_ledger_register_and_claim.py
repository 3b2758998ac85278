"""register+claim as one statement, for one Run and for a whole tick, and the batched lease
renewal, on both dialects: the same rules as ``register`` followed by ``claim``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from store import InvalidInput, LeaseLost, Ledger, OutboxMessage, RunConflict, RunIdentity
from tests.support.ledger import register_and_claim, snapshot, wait_for_db_clock

PERIOD = datetime(2026, 11, 29, 23, 0, tzinfo=UTC)
LONG = timedelta(minutes=15)
SHORT = timedelta(seconds=1)
PARAMS = {"recipients": ["ana@example.com"]}


def identity(subject: str = "team-a") -> RunIdentity:
    return RunIdentity("digest", subject, PERIOD, "v1")


def test_a_new_run_is_registered_already_claimed_with_its_attempt(ledger: Ledger) -> None:
    """One call creates the Run running under fence 1 and opens its Attempt."""
    entered = register_and_claim(ledger, identity(), PARAMS, owner="worker-1:101", lease=LONG)
    assert entered.claim is not None and entered.conflict is None
    run = ledger.get(entered.run.run_id)
    assert (run.status, run.fence, run.attempts, run.owner) == ("running", 1, 1, "worker-1:101")
    assert run.params == PARAMS and run.period_start == PERIOD
    assert entered.run.run_id == identity().run_id
    attempts = ledger.attempts(run.run_id)
    assert [(a.attempt_id, a.fence, a.outcome) for a in attempts] == [
        (entered.claim.attempt_id, 1, None)]
    assert entered.claim.lease_expires_at == run.lease_expires_at


def test_a_registered_pending_run_is_claimed_like_claim_does(ledger: Ledger) -> None:
    pending = ledger.register(identity(), PARAMS)
    entered = register_and_claim(ledger, identity(), PARAMS, owner="worker-1:101", lease=LONG)
    assert entered.claim is not None and entered.claim.fence == pending.fence + 1
    assert entered.run.status == "running"


def test_a_run_under_another_live_lease_is_not_claimed_and_nothing_changes(ledger: Ledger) -> None:
    register_and_claim(ledger, identity(), PARAMS, owner="worker-1:101", lease=LONG)
    before = snapshot(ledger)
    entered = register_and_claim(ledger, identity(), PARAMS, owner="worker-2:202", lease=LONG)
    assert entered.claim is None and entered.conflict is None
    assert (entered.run.status, entered.run.owner) == ("running", "worker-1:101")
    assert snapshot(ledger) == before


def test_an_expired_lease_is_reclaimed_and_the_old_attempt_closed_as_expired(ledger: Ledger) -> None:
    first = register_and_claim(ledger, identity(), PARAMS, owner="worker-1:101", lease=SHORT).claim
    assert first is not None
    wait_for_db_clock(ledger, first.lease_expires_at)
    second = register_and_claim(ledger, identity(), PARAMS, owner="worker-2:202", lease=LONG).claim
    assert second is not None and second.fence == 2
    assert [(a.fence, a.outcome) for a in ledger.attempts(second.run_id)] == [(1, "expired"), (2, None)]
    with pytest.raises(LeaseLost):
        ledger.save_input(first, {"items": ["stale"]})


def test_a_completed_run_returns_its_stored_output_and_writes_nothing(ledger: Ledger) -> None:
    claim = register_and_claim(ledger, identity(), PARAMS, owner="worker-1:101", lease=LONG).claim
    assert claim is not None
    ledger.complete(claim, {"summary": "first"}, [OutboxMessage("ana@example.com", "Digest", "x")])
    before = snapshot(ledger)
    again = register_and_claim(ledger, identity(), PARAMS, owner="worker-2:202", lease=LONG)
    assert again.claim is None and again.run.status == "completed"
    assert again.run.output == {"summary": "first"}
    assert snapshot(ledger) == before


def test_a_failed_run_is_not_claimed(ledger: Ledger) -> None:
    claim = register_and_claim(ledger, identity(), PARAMS, owner="worker-1:101", lease=LONG).claim
    assert claim is not None
    ledger.fail(claim, "invalid input", retryable=False)
    again = register_and_claim(ledger, identity(), PARAMS, owner="worker-1:101", lease=LONG)
    assert again.claim is None and again.run.status == "failed"


def test_changed_params_under_the_same_key_is_a_conflict_that_writes_nothing(ledger: Ledger) -> None:
    ledger.register(identity(), PARAMS)
    before = snapshot(ledger)
    with pytest.raises(RunConflict, match="different parameters"):
        register_and_claim(ledger, identity(), {"recipients": ["eve@example.com"]},
                           owner="worker-1:101", lease=LONG)
    assert snapshot(ledger) == before


def test_a_batch_claims_the_free_runs_and_reports_the_others_without_raising(ledger: Ledger) -> None:
    """A tick's subjects in one call: a conflict or a held lease of one subject does not stop
    the others; results come back for every identity, in the order given."""
    ledger.register(identity("conflicting"), PARAMS)
    register_and_claim(ledger, identity("held"), PARAMS, owner="worker-2:202", lease=LONG)
    subjects = ["new-b", "conflicting", "held", "new-a", "new-b"]
    entries = [(identity(s), {"recipients": ["eve@example.com"]} if s == "conflicting" else PARAMS)
               for s in subjects]
    found = ledger.register_and_claim_many(entries, owner="worker-1:101", lease=LONG)
    assert [r.run.subject for r in found.values()] == ["new-b", "conflicting", "held", "new-a"]
    by_subject = {r.run.subject: r for r in found.values()}
    assert by_subject["new-a"].claim is not None and by_subject["new-b"].claim is not None
    assert by_subject["new-a"].run.status == "running"
    assert by_subject["held"].claim is None and by_subject["held"].run.owner == "worker-2:202"
    conflict = by_subject["conflicting"]
    assert conflict.claim is None and isinstance(conflict.conflict, RunConflict)
    assert ledger.get(conflict.run.run_id).status == "pending"
    assert len(ledger.attempts(by_subject["new-b"].run.run_id)) == 1


def test_an_empty_batch_writes_nothing(ledger: Ledger) -> None:
    assert ledger.register_and_claim_many([], owner="worker-1:101", lease=LONG) == {}


def test_a_batch_entry_that_is_not_an_identity_is_refused_before_anything_is_written(
        ledger: Ledger) -> None:
    before = snapshot(ledger)
    with pytest.raises(InvalidInput, match="RunIdentity"):
        ledger.register_and_claim_many([(identity(), PARAMS), ("team-b", PARAMS)],  # type: ignore[list-item]
                                       owner="worker-1:101", lease=LONG)
    assert snapshot(ledger) == before


def test_renew_many_extends_the_held_leases_and_leaves_out_the_lost_ones(ledger: Ledger) -> None:
    found = ledger.register_and_claim_many(
        [(identity(s), PARAMS) for s in ("a", "b", "c")], owner="worker-1:101", lease=SHORT)
    claims = {r.run.subject: r.claim for r in found.values()}
    assert all(claims.values())
    lost = claims["c"]
    assert lost is not None
    wait_for_db_clock(ledger, lost.lease_expires_at)
    taken = register_and_claim(ledger, identity("c"), PARAMS, owner="worker-2:202", lease=LONG)
    assert taken.claim is not None
    held = [c for c in claims.values() if c is not None]
    renewed = ledger.renew_many(held, LONG)
    assert set(renewed) == {identity("a").run_id, identity("b").run_id}
    now = ledger.database.now()
    assert all(until > now + LONG - timedelta(seconds=5) for until in renewed.values())
    assert ledger.get(identity("c").run_id).lease_expires_at == taken.claim.lease_expires_at
    assert ledger.renew_many([], LONG) == {}
