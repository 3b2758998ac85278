"""The lease keeper renews the leases of every Run a tick's batch still works on, in one
background thread and one statement per round, so that long model calls and subjects waiting for a pool
slot keep their claims; a Run whose fence moved on is reported lost, and its subject must stop.
So are all the claims once the rounds have failed for longer than the lease (the ledger
unreachable): their leases have lapsed and another attempt may hold the Runs, so the subjects
stop at their next stage instead of each retrying against a ledger they cannot reach."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from types import TracebackType

from flows.errors import LeaseLapsed
from store import Claim, LeaseLost, Ledger

RENEW_FRACTION = 1 / 3  # renew well before expiry: two renewals may fail before the lease lapses

log = logging.getLogger(__name__)
# Every keeper still running in this process: what a second Ctrl-C releases before the
# process exits without waiting for the stages under way.
_running: weakref.WeakSet[LeaseKeeper] = weakref.WeakSet()


class LeaseKeeper:
    """Renews the held claims every ``lease_seconds * RENEW_FRACTION`` until stopped;
    ``clock`` is a monotonic clock (a test's own)."""

    def __init__(self, ledger: Ledger, lease_seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ledger = ledger
        self.lease_seconds = lease_seconds
        self.interval = lease_seconds * RENEW_FRACTION
        self.clock = clock
        self.renewals = 0  # rounds that renewed at least one claim
        self._held: dict[str, Claim] = {}
        self._lost: dict[str, str] = {}
        # When the last round that reached the ledger was sent (the claims were made just
        # before the keeper), and what the rounds since then failed with.
        self._reached_at = clock()
        self._failing: Exception | None = None
        # The subjects' threads and the keeper's thread share the two maps.
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="lease-keeper", daemon=True)

    def hold(self, claims: Iterable[Claim]) -> None:
        """Keep these claims alive from now on."""
        with self._lock:
            self._held.update((c.run_id, c) for c in claims)

    def release(self, claim: Claim) -> None:
        """The subject of ``claim`` ended: stop renewing its lease."""
        with self._lock:
            if self._held.get(claim.run_id) == claim:
                del self._held[claim.run_id]

    def held(self) -> list[Claim]:
        with self._lock:
            return list(self._held.values())

    def lost(self, claim: Claim) -> LeaseLost | None:
        """Why ``claim`` is lost (``LeaseLapsed`` when the rounds failed for longer than the
        lease), or None while it is still held."""
        with self._lock:
            reason = self._lost.get(claim.run_id)
            failing, unrenewed = self._failing, self.clock() - self._reached_at
        if reason is not None:
            return LeaseLost(reason)
        if failing is not None and unrenewed > self.lease_seconds:
            return LeaseLapsed(
                f"run {claim.run_id}: lease of fence {claim.fence} lapsed: not renewed for "
                f"{unrenewed:.0f} s (lease {self.lease_seconds:g} s); the last renewal failed: "
                f"{failing}")
        return None

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        _running.add(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        # No join: a renewal still in flight is fenced like every write, so waiting for the
        # thread to wake up and exit would only delay the end of the tick.
        self._stop.set()
        _running.discard(self)

    def abandon(self, reason: str) -> list[str]:
        """Release every held claim (its Run back to pending, retryable) because this process
        is about to exit with its stages under way; returns the Run ids released. A stage that
        still finishes later is fenced out and changes nothing."""
        self.stop()
        released: list[str] = []
        for claim in self.held():
            try:
                self.ledger.fail(claim, reason, retryable=True)
                released.append(claim.run_id)
            except Exception:  # already completed or taken over: nothing of ours to release
                log.debug("run %s was not released", claim.run_id, exc_info=True)
        return released


    def renew(self) -> None:
        """One round: renew every held claim in one statement; the ones left out are lost."""
        claims = self.held()
        if not claims:
            return
        sent = self.clock()
        try:
            renewed = self.ledger.renew_many(claims, self.lease_seconds)
        except Exception as exc:
            with self._lock:
                self._failing = exc
            raise
        with self._lock:
            self._reached_at, self._failing = sent, None
            for claim in claims:
                # A subject that ended during the round is no longer held: a completed Run
                # is left out of the renewal, and that is no loss.
                if claim.run_id not in renewed and self._held.get(claim.run_id) == claim:
                    del self._held[claim.run_id]
                    self._lost[claim.run_id] = (
                        f"run {claim.run_id}: fence {claim.fence} of {claim.owner} is no longer "
                        "current (another attempt took the Run, or it stopped running)"
                    )
        if renewed:
            self.renewals += 1

    def _keep(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.renew()
            except Exception:
                # The next round may succeed; if a lease lapses meanwhile, the fence check at
                # persist still refuses a stale write.
                log.warning("renewing %d leases failed", len(self.held()), exc_info=True)


def abandon_every_lease(reason: str) -> list[str]:
    """Release the claims of every running keeper of this process (see ``LeaseKeeper.abandon``)."""
    return [run_id for keeper in list(_running) for run_id in keeper.abandon(reason)]
