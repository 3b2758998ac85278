"""The retry policy: full-jitter exponential backoff inside attempt and window limits."""

from __future__ import annotations

import itertools
import random
import statistics
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TypedDict

import pytest

from flows.delivery.policy import RetryPolicy, Status, UncertainPolicy
from flows.errors import DeliveryConfigurationError
from flows.transport import OutcomeKind, SendOutcome
from store import InvalidInput, MessageClaim, Reply

QUEUED = datetime(2026, 1, 5, 9, tzinfo=UTC)
POLICY = RetryPolicy(max_attempts=8, base_delay=30, max_delay=3600, max_window=12 * 3600)


class Limits(TypedDict, total=False):
    """The numeric limits of a RetryPolicy, as overrides for ``dataclasses.replace``."""

    max_attempts: int
    base_delay: float
    max_delay: float
    max_window: float


def claim(attempt: int = 1, waited: float = 0.0) -> MessageClaim:
    return MessageClaim(
        message_id="k" * 64, owner="test", fence=attempt, attempt=attempt, run_id="r" * 64,
        channel="email", recipient="a@example.com", subject="s", body="b", headers={},
        created_at=QUEUED, claimed_at=QUEUED + timedelta(seconds=waited),
    )


def outcome(kind: OutcomeKind, retry_after: float | None = None) -> SendOutcome:
    return SendOutcome(kind, Reply(code=451, text="later"), retry_after=retry_after)


def test_backoff_grows_exponentially_with_full_jitter_up_to_the_cap() -> None:
    """Delays after attempt n lie in [0, min(cap, base*2^(n-1))], vary, and their mean doubles."""
    rng = random.Random(7)
    means = []
    for attempt in range(1, 10):
        ceiling = POLICY.ceiling(attempt)
        samples = [POLICY.backoff(attempt, rng) for _ in range(2000)]
        assert all(0 <= s <= ceiling for s in samples)
        assert len(set(samples)) > 1900  # jitter: no two retries agree
        means.append(statistics.fmean(samples))
    assert POLICY.ceiling(1) == 30 and POLICY.ceiling(2) == 60 and POLICY.ceiling(9) == 3600
    assert all(later > earlier * 1.7 for earlier, later in itertools.pairwise(means[:7]))
    assert means[-1] == pytest.approx(1800, rel=0.1)  # capped: uniform(0, 3600)


def test_a_transient_failure_is_retried_after_the_backoff() -> None:
    """Attempt 3 failing transiently is scheduled within its ceiling."""
    decision = POLICY.decide(claim(3), outcome(OutcomeKind.TRANSIENT), random.Random(1))
    assert decision.status is Status.RETRY
    assert decision.delay is not None and 0 <= decision.delay <= 120
    assert decision.error == "451 later"


def test_retry_after_is_a_lower_bound_on_the_delay() -> None:
    """The receiver's Retry-After wins over a shorter jittered backoff."""
    decision = POLICY.decide(claim(1), outcome(OutcomeKind.TRANSIENT, retry_after=500),
                             random.Random(1))
    assert decision.delay == 500


def test_the_attempt_limit_makes_a_transient_failure_dead() -> None:
    """The max_attempts-th transient failure is final."""
    decision = POLICY.decide(claim(8), outcome(OutcomeKind.TRANSIENT), random.Random(1))
    assert decision.status is Status.DEAD
    assert decision.error is not None and "gave up after 8 attempts" in decision.error


def test_the_window_makes_a_transient_failure_dead() -> None:
    """A retry that would land past the window (from queueing, database clock) is not scheduled."""
    decision = POLICY.decide(claim(2, waited=12 * 3600 - 1), outcome(OutcomeKind.TRANSIENT),
                             random.Random(3))
    assert decision.status is Status.DEAD
    assert decision.error is not None and "retry window of 12 h exhausted" in decision.error


def test_a_permanent_failure_is_dead_at_once() -> None:
    """A 5xx is never retried, whatever attempt it was."""
    decision = POLICY.decide(claim(1), outcome(OutcomeKind.PERMANENT), random.Random(1))
    assert (decision.status, decision.delay) == (Status.DEAD, None)


def test_an_ambiguous_outcome_is_uncertain_and_retried_by_default() -> None:
    """Lost after DATA: uncertain, due again after a backoff (same key)."""
    decision = POLICY.decide(claim(1), outcome(OutcomeKind.AMBIGUOUS), random.Random(1))
    assert decision.status is Status.UNCERTAIN and decision.delay is not None


def test_the_hold_policy_leaves_uncertain_messages_for_an_operator() -> None:
    """uncertain=hold: no next attempt."""
    hold = replace(POLICY, uncertain=UncertainPolicy.HOLD)
    decision = hold.decide(claim(1), outcome(OutcomeKind.AMBIGUOUS), random.Random(1))
    assert (decision.status, decision.delay) == (Status.UNCERTAIN, None)


def test_an_uncertain_message_past_its_limits_stays_uncertain_not_dead() -> None:
    """The receiver may have it, so exhausting the limits holds it rather than calling it dead."""
    decision = POLICY.decide(claim(8), outcome(OutcomeKind.AMBIGUOUS), random.Random(1))
    assert (decision.status, decision.delay) == (Status.UNCERTAIN, None)
    assert decision.error is not None and "held for an operator" in decision.error


def test_a_window_longer_than_the_key_retention_is_refused() -> None:
    """A 25 h window over a 24 h provider retention is a configuration error; SMTP has none."""
    with pytest.raises(DeliveryConfigurationError, match="longer than provider's"):
        replace(POLICY, max_window=25 * 3600).check_retention(24 * 3600, "provider")
    POLICY.check_retention(24 * 3600, "provider")
    replace(POLICY, max_window=99 * 3600).check_retention(None, "smtp")


@pytest.mark.parametrize("bad", [{"max_attempts": 0}, {"base_delay": 0}, {"base_delay": 10, "max_delay": 5},
                                 {"max_window": 0}])
def test_nonsensical_limits_are_refused(bad: Limits) -> None:
    """Limits that cannot work are refused when the policy is made."""
    with pytest.raises(InvalidInput):
        replace(POLICY, **bad)
