"""The limiter a tick's calls to one endpoint go through: before a call leaves it takes the
call's slot of the endpoint's shared limits in the ledger, waiting as long as the ledger says,
and records the call in flight; a provider's refusal pauses the endpoint for every worker; an
answer settles the tokens the call took (its bound) to what it used.

An endpoint that bounds its calls in flight takes the slot and records the call in one
transaction, its row locked throughout (the count of calls in flight must include every call
recorded before); any other takes the slot in one statement of its own and records the call
after it, so that the row is never held across a round trip and a slow link to the database
does not make every worker's calls wait for each other.

Each answer's announced limits (its rate-limit headers, ``flows.model.announced``) become the
endpoint's ``Announcement`` in the ledger (``learned``): its requests and tokens per minute, and
a pause until the quota resets when the provider says it is nearly spent.

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
from dataclasses import replace

from flows.model.announced import Announced, Quota
from store import (
    Announcement,
    CallBook,
    Claim,
    InFlight,
    Intent,
    LedgerUnavailable,
    Slot,
    SlotUnavailable,
    Usage,
)

POLL_SECONDS = 0.05  # how often to ask while only the calls in flight are too many
JITTER = 0.1  # a share of each wait added at random: workers do not all ask at once
# Both providers announce limits per minute (OpenAI's RPM and TPM, Anthropic's), OpenAI's
# lowest tiers also per day. The window is read from the reset (the time until the quota is
# whole again, refilled evenly: reset x limit / (limit - remaining)) only when that says far
# longer than a minute: near a full quota, a whole number of requests left makes it noise.
MINUTE = 60.0
LONG_WINDOW_SECONDS = 600.0
# A quota with less than this share of its limit left (always one with none left) is nearly
# spent: the calls already on their way take the rest, so the endpoint pauses until it resets.
NEARLY_SPENT_SHARE = 0.01


def _window(quota: Quota) -> float:
    """The seconds an announced limit is counted over (see ``LONG_WINDOW_SECONDS``)."""
    limit, left, reset = quota.limit, quota.remaining, quota.reset_seconds
    if limit is None or left is None or reset is None or not limit > left:
        return MINUTE
    inferred = reset * limit / (limit - left)
    return inferred if inferred > LONG_WINDOW_SECONDS else MINUTE


def _per_minute(quota: Quota) -> float | None:
    """The announced limit as a rate per minute; None when it announces no positive limit."""
    if not quota.limit:
        return None
    return quota.limit * MINUTE / _window(quota)


def _spent_for(quota: Quota) -> float | None:
    """How long to pause when the quota is nearly spent: until it resets; None otherwise (or
    when it names no reset)."""
    if quota.remaining is None or quota.reset_seconds is None:
        return None
    nearly_spent = max(1.0, NEARLY_SPENT_SHARE * (quota.limit or 0))
    return quota.reset_seconds if quota.remaining < nearly_spent else None


def learned(announced: Announced | None, max_pause_seconds: float) -> Announcement | None:
    """What an answer's announced limits tell the endpoint's row: requests per minute (from
    the requests quota), tokens per minute (the total tokens quota: a call's share of the
    tokens bucket is its input and output together, so Anthropic's input and output quotas
    apart are not taken), what is left of each, and a pause until the later reset of a nearly
    spent quota, at most ``max_pause_seconds``; None when nothing usable was announced."""
    if announced is None:
        return None
    requests, tokens = announced.requests, announced.tokens
    pauses = [p for p in (_spent_for(requests), _spent_for(tokens)) if p is not None]
    tokens_per_minute = _per_minute(tokens)
    found = Announcement(
        requests_per_minute=_per_minute(requests),
        tokens_per_minute=None if tokens_per_minute is None else max(1, round(tokens_per_minute)),
        requests_remaining=requests.remaining, tokens_remaining=tokens.remaining,
        pause_seconds=min(max(pauses), max_pause_seconds) if pauses else None)
    return None if found == Announcement() else found


class EndpointLimiter:
    """The shared limits of endpoint ``name`` as this process meets them; a refusal's pause
    lasts what the provider asked, at most ``max_pause_seconds``; ``bounds_in_flight`` when
    the endpoint limits its calls in flight. ``sleep`` waits (a flow run's stop makes it
    raise, so that a cancelled tick waits no longer)."""

    def __init__(self, book: CallBook, name: str, *, in_flight_seconds: float,
                 max_pause_seconds: float, bounds_in_flight: bool,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.book = book
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
        slot = Slot(self.name, tokens, self.in_flight_seconds, self.bounds_in_flight)
        intent = replace(intent, slot=slot)
        seen = self._times_unreachable
        with self._turn:
            self._fail_if_found_unreachable_since(seen)
            try:
                while True:
                    if self.bounds_in_flight:  # the slot is taken with the call's record
                        try:
                            return self.book.record_intent(claim, intent)
                        except SlotUnavailable as unavailable:
                            decision = unavailable.decision
                    else:
                        decision = self.book.take_slot(slot)
                        if decision.granted:
                            break
                    wait = decision.wait_seconds(POLL_SECONDS)
                    self.sleep(wait * (1 + random.uniform(0, JITTER)))
            except LedgerUnavailable as exc:
                self._unreachable = exc
                self._times_unreachable += 1
                raise
        return self.book.record_intent(claim, intent)

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
        self.book.endpoint_refused(call, pause, self.max_pause_seconds)

    def answered(self, call: InFlight, usage: Usage, announced: Announced | None = None) -> None:
        """Settle the call's tokens, take in the limits its answer ``announced`` (for every
        worker) and let the endpoint's rate grow back."""
        self.book.endpoint_answered(call, usage, learned(announced, self.max_pause_seconds))
