"""The tick's lease keeper on real ledgers: it keeps every held claim alive with one statement
per round, stops renewing the claims of subjects that ended, and notices when a fence moved to
another owner."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from flows.errors import LeaseLapsed
from flows.run_job.lease_keeper import LeaseKeeper
from store import Claim, Ledger, RunIdentity
from store.errors import RunledgerError
from tests.support.ledger import write_locked
from tests.support.pipeline import lease_expired, wait_until


def claimed(ledger: Ledger, subject: str, owner: str, lease: float) -> Claim:
    identity = RunIdentity("keeper", subject, datetime(2026, 1, 5, tzinfo=UTC), "1")
    ledger.register(identity)
    claim = ledger.claim(identity.run_id, owner, lease)
    assert claim is not None
    return claim


def lease_expiry(ledger: Ledger, run_id: str) -> datetime:
    """The lease expiry of a claimed Run (a claimed Run has one)."""
    expires_at = ledger.get(run_id).lease_expires_at
    assert expires_at is not None
    return expires_at


def test_the_keeper_renews_every_held_claim_in_one_statement(ledger: Ledger) -> None:
    """Three claims of one tick are renewed by one round that reads the database clock once:
    every new expiry is the same instant (separate statements would each read it anew)."""
    claims = [claimed(ledger, s, "tick-a", 60) for s in ("acme", "globex", "initech")]
    before = {c.run_id: lease_expiry(ledger, c.run_id) for c in claims}
    keeper = LeaseKeeper(ledger, 60)
    keeper.hold(claims)
    time.sleep(0.05)
    keeper.renew()
    after = {c.run_id: lease_expiry(ledger, c.run_id) for c in claims}
    assert len(set(after.values())) == 1
    assert all(after[run_id] > expiry for run_id, expiry in before.items())
    assert all(keeper.lost(c) is None for c in claims)
    assert keeper.renewals == 1 and sorted(keeper.held(), key=str) == sorted(claims, key=str)


def test_the_keeper_keeps_short_leases_alive_in_the_background(ledger: Ledger) -> None:
    """Two 0.6 s leases kept through five renewal rounds (at least 1 s, a round every 0.2 s)
    are still held: the thread renews them before they run out."""
    claims = [claimed(ledger, s, "tick-a", 0.6) for s in ("acme", "globex")]
    with LeaseKeeper(ledger, 0.6) as keeper:
        keeper.hold(claims)
        wait_until(lambda: keeper.renewals >= 5, 30, "five renewal rounds of the keeper")
        assert not any(lease_expired(ledger, c.run_id) for c in claims)
    assert keeper.renewals >= 5 and all(keeper.lost(c) is None for c in claims)
    assert ledger.claim(claims[0].run_id, "tick-b", 60) is None


def test_a_released_claim_is_no_longer_renewed_and_the_others_still_are(ledger: Ledger) -> None:
    """The subject that ended leaves the set: its lease runs out, the other one's does not."""
    done, working = (claimed(ledger, s, "tick-a", 0.6) for s in ("acme", "globex"))
    with LeaseKeeper(ledger, 0.6) as keeper:
        keeper.hold([done, working])
        keeper.release(done)
        assert keeper.held() == [working]
        wait_until(lambda: lease_expired(ledger, done.run_id), 10, "the released lease to expire")
        assert not lease_expired(ledger, working.run_id)
    assert keeper.lost(done) is None and keeper.lost(working) is None


def test_a_completed_run_leaves_the_keeper_without_being_reported_lost(ledger: Ledger) -> None:
    """Completing a Run ends its lease; once released, the next round renews only the rest."""
    done, working = (claimed(ledger, s, "tick-a", 60) for s in ("acme", "globex"))
    keeper = LeaseKeeper(ledger, 60)
    keeper.hold([done, working])
    ledger.complete(done, {"text": "summary"}, [], None)
    keeper.release(done)
    keeper.renew()
    assert keeper.held() == [working]
    assert keeper.lost(done) is None and keeper.lost(working) is None


def test_the_keeper_reports_a_lost_lease_once_the_fence_moved_and_stops_renewing_it(
        ledger: Ledger) -> None:
    """After another owner took an expired Run, the stale claim is lost; the others are kept."""
    stale = claimed(ledger, "acme", "tick-a", 0.3)
    kept = claimed(ledger, "globex", "tick-a", 60)
    wait_until(lambda: lease_expired(ledger, stale.run_id), 10, "the lease to expire")
    assert ledger.claim(stale.run_id, "tick-b", 60) is not None
    with LeaseKeeper(ledger, 0.3) as keeper:
        keeper.hold([stale, kept])
        wait_until(lambda: keeper.lost(stale) is not None, 5, "the keeper to notice")
    reason = keeper.lost(stale)
    assert reason is not None and "no longer current" in str(reason)
    assert keeper.held() == [kept] and keeper.lost(kept) is None
    assert ledger.get(stale.run_id).owner == "tick-b"


def test_claims_lapse_after_failing_rounds_longer_than_the_lease_until_one_reaches_the_ledger(
        db_url: str, ledger: Ledger) -> None:
    """Renewals refused for 11 s of a 10 s lease (another session holds the write lock, the
    keeper's clock is the test's): every claim is reported lapsed, naming the failure, and
    none before the lease ran out; the first round that reaches the ledger again ends it."""
    claims = [claimed(ledger, s, "tick-a", 60) for s in ("acme", "globex")]
    now = [100.0]
    with Ledger.connect(db_url, busy_timeout_ms=50, locked_retries=0,
                        lock_timeout_ms=50) as impatient:
        keeper = LeaseKeeper(impatient, 10, clock=lambda: now[0])
        keeper.hold(claims)
        with write_locked(db_url):
            now[0] = 104.0
            with pytest.raises(RunledgerError):
                keeper.renew()
            assert all(keeper.lost(c) is None for c in claims)
            now[0] = 111.0
            lapsed = [keeper.lost(c) for c in claims]
            assert all(isinstance(e, LeaseLapsed) for e in lapsed), lapsed
            assert "not renewed for 11 s (lease 10 s); the last renewal failed" in str(lapsed[0])
        keeper.renew()
        assert all(keeper.lost(c) is None for c in claims)
        assert keeper.held() == claims


def test_a_keeper_that_did_not_try_for_longer_than_the_lease_reports_nothing_lapsed(
        ledger: Ledger) -> None:
    """Only failed rounds are evidence: a keeper thread that did not run for two leases (a
    stalled process) leaves the claims to the fence, which still decides every write."""
    claim = claimed(ledger, "acme", "tick-a", 60)
    now = [0.0]
    keeper = LeaseKeeper(ledger, 10, clock=lambda: now[0])
    keeper.hold([claim])
    now[0] = 25.0
    assert keeper.lost(claim) is None
