"""The limiter a tick's calls to one endpoint go through: before a call leaves it takes the
call's slot of the endpoint's shared limits in the ledger, waiting as long as the ledger says,
and records the call in flight; a provider's refusal pauses the endpoint for every worker; an
answer settles the tokens the call took (its bound) to what it used.

An endpoint that bounds its calls in flight takes the slot and records the call in one
transaction, its row locked throughout (the count of calls in flight must include every call
recorded before); any other takes the slot in one statement of its own and records the call
after it, so that the row is never held across a round trip and a slow link to the database
does not make every worker's calls wait for each other.

One thread of a process asks the ledger at a time, the others queue behind it: each asking is
one round trip, and a crowd of threads asking together would only contend for the row. When an
asking finds the ledger unreachable, the threads that queued behind it fail with the same error
without asking: each would otherwise wait its own connect timeout in turn, and a worker cut from
the database would give up one subject at a time."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

from store import Acquisition, CallBook, Claim, InFlight, Intent, LedgerUnavailable, Usage

POLL_SECONDS = 0.05  # how often to ask while only the calls in flight are too many
JITTER = 0.1  # a share of each wait added at random: workers do not all ask at once


class EndpointLimiter:
    """The shared limits of endpoint ``name`` as this process meets them; a refusal's pause
    lasts what the provider asked, at most ``max_pause_seconds``; ``bounds_in_flight`` when
    the endpoint limits its calls in flight. ``sleep`` waits (a flow run's stop makes it
    raise, so that a cancelled tick waits no longer)."""

    def __init__(self, calls: CallBook, name: str, *, in_flight_seconds: float,
                 max_pause_seconds: float, bounds_in_flight: bool,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.calls = calls
        self.sleep = sleep
        self.name = name
        self.bounds_in_flight = bounds_in_flight
        self.in_flight_seconds = in_flight_seconds
        self.max_pause_seconds = max_pause_seconds
        self._turn = threading.Lock()
        self._unreachable: LedgerUnavailable | None = None  # what the last such asking found
        self._times_unreachable = 0  # how many askings found the ledger unreachable

    def record(self, claim: Claim, intent: Intent, tokens: int) -> InFlight:
        """Record the call in flight once the endpoint's limits allow it (sleeping meanwhile),
        taking ``tokens`` (the call's bound: input bounded plus ``max_tokens``) of its tokens
        per minute until its answer settles them; ``LeaseLost`` and ``BudgetExhausted`` as
        ``CallBook.record_intent``; ``LedgerUnavailable`` at once if the ledger was found
        unreachable while this call queued for its turn."""
        taken = Acquisition(self.name, tokens, self.in_flight_seconds)
        seen = self._times_unreachable
        with self._turn:
            self._fail_if_found_unreachable_since(seen)
            try:
                while True:
                    found = (self.calls.record_intent_when_allowed(claim, intent, taken)
                             if self.bounds_in_flight else self.calls.take_slot(taken))
                    if isinstance(found, InFlight):
                        return found
                    if found.granted:
                        break
                    wait = found.wait_seconds(POLL_SECONDS)
                    self.sleep(wait * (1 + random.uniform(0, JITTER)))
            except LedgerUnavailable as exc:
                self._unreachable = exc
                self._times_unreachable += 1
                raise
        return self.calls.record_intent(claim, intent, taken)

    def _fail_if_found_unreachable_since(self, seen: int) -> None:
        """A call that queued while an asking ahead of it found the ledger unreachable fails
        with that error instead of waiting for its own timeout (its task's retries ask anew)."""
        error = self._unreachable
        if error is None or self._times_unreachable == seen:
            return
        raise LedgerUnavailable(f"{error} (found by the call ahead of this one in the queue for "
                                f"endpoint {self.name!r}; this call did not ask)") from error

    def refused(self, call: InFlight, retry_after: float | None) -> None:
        """The provider refused the call: pause the endpoint for every worker."""
        pause = None if retry_after is None else min(retry_after, self.max_pause_seconds)
        self.calls.endpoint_refused(call, pause, self.max_pause_seconds)

    def answered(self, call: InFlight, usage: Usage) -> None:
        """Settle the call's tokens and let the endpoint's rate grow back."""
        self.calls.endpoint_answered(call, usage)
