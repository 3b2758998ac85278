"""The lease keeper on real ledgers: it keeps a long stage's claim alive, and notices when the
fence moved to another owner."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from pipeline_support import lease_expired, wait_until

from flows.lease_keeper import LeaseKeeper
from store import Claim, Ledger, RunIdentity


def claimed(ledger: Ledger, owner: str, lease: float) -> Claim:
    identity = RunIdentity("keeper", "acme", datetime(2026, 1, 5, tzinfo=UTC), "1")
    ledger.register(identity)
    claim = ledger.claim(identity.run_id, owner, lease)
    assert claim is not None
    return claim


def test_the_keeper_renews_the_lease_while_a_stage_runs(ledger: Ledger) -> None:
    """A 0.6 s lease kept for 1.5 s is still held, renewed every fifth of a second or so."""
    claim = claimed(ledger, "worker-a", 0.6)
    with LeaseKeeper(ledger, claim, 0.6) as keeper:
        time.sleep(1.5)
        assert not lease_expired(ledger, claim.run_id)
    assert keeper.renewals >= 3 and not keeper.lost
    assert ledger.claim(claim.run_id, "worker-b", 60) is None


def test_the_keeper_reports_a_lost_lease_once_the_fence_moved(ledger: Ledger) -> None:
    """After another worker took the expired Run, the stale worker's keeper says so."""
    stale = claimed(ledger, "worker-a", 0.3)
    wait_until(lambda: lease_expired(ledger, stale.run_id), 10, "the lease to expire")
    assert ledger.claim(stale.run_id, "worker-b", 60) is not None
    with LeaseKeeper(ledger, stale, 0.3) as keeper:
        wait_until(lambda: keeper.lost, 5, "the keeper to notice")
    assert keeper.reason is not None and "no longer current" in keeper.reason
