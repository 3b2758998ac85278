"""The lease keeper renews a Run's lease in the background while a stage runs, so that a long
model call keeps its claim; when a renewal finds the fence moved, the attempt must stop."""

from __future__ import annotations

import logging
import threading
from types import TracebackType

from store import Claim, LeaseLost, Ledger

RENEW_FRACTION = 1 / 3  # renew well before expiry: two renewals may fail before the lease lapses

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Renews ``claim`` every ``lease_seconds * RENEW_FRACTION`` until stopped or lost."""

    def __init__(self, ledger: Ledger, claim: Claim, lease_seconds: float) -> None:
        self.ledger = ledger
        self.claim = claim
        self.lease_seconds = lease_seconds
        self.interval = lease_seconds * RENEW_FRACTION
        self.renewals = 0
        self.reason: str | None = None
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._thread = threading.Thread(
            target=self._keep, name=f"lease-keeper-{claim.run_id[:12]}", daemon=True
        )

    @property
    def lost(self) -> bool:
        """True once a renewal found that another attempt holds the Run."""
        return self._lost.is_set()

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        # No join: a renewal still in flight is fenced like every write, so waiting for the
        # thread to wake up and exit would only delay the subject.
        self._stop.set()

    def _keep(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.ledger.renew(self.claim, self.lease_seconds)
                self.renewals += 1
            except LeaseLost as exc:
                self.reason = str(exc)
                self._lost.set()
                return
            except Exception:
                # The next renewal may succeed; if the lease lapses meanwhile, the fence check
                # at persist still refuses a stale write.
                log.warning("renewing the lease of run %s failed", self.claim.run_id, exc_info=True)
