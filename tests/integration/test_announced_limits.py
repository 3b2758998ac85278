"""Limits learned from the provider's headers, on both ledgers, through the openai SDK against
a rate-limited server on loopback that announces them as OpenAI does: an endpoint with nothing
configured adopts them; a lower configured limit wins; a nearly spent quota pauses the endpoint
before the provider has to refuse; a second process (another connection to the same ledger)
starts at the learned rate; bad headers are ignored; an endpoint knowing no rate sends one
call first and the others after its answer."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bench.limited_provider import Announce, LimitedModelServer
from flows.model import CallCount, EndpointLimiter, RecordedModel
from flows.model.openai_compatible import OpenAICompatibleModel
from flows.prices import PriceList
from store import Claim, InFlight, Intent, Ledger, Limits, RunIdentity, Slot, Usage
from tests.support.ledger import claim_of

PERIOD = datetime(2026, 12, 2, tzinfo=UTC)
DIGEST = "0" * 64


def claimed(ledger: Ledger, subject: str) -> Claim:
    return claim_of(ledger, RunIdentity("announced", subject, PERIOD, "v1"),
                    lease=timedelta(minutes=5))


def limited(server: LimitedModelServer, ledger: Ledger, claim: Any,
            max_pause: float = 60.0) -> RecordedModel:
    inner = OpenAICompatibleModel(server.base_url, "probe-model", timeout_seconds=5)
    limiter = EndpointLimiter(ledger.calls, "ep", in_flight_seconds=5,
                              max_pause_seconds=max_pause, bounds_in_flight=False)
    return RecordedModel(inner, ledger.calls, claim, PriceList(), CallCount(), limiter=limiter)


def answer_once(ledger: Ledger, limits: Limits, *, rate: float = 10.0,
                announce: Announce | None = "openai", tokens_per_minute: int | None = None,
                max_pause: float = 60.0) -> LimitedModelServer:
    """One call of endpoint ``ep`` (configured with ``limits``) answered by the server."""
    ledger.calls.configure_endpoint("ep", limits)
    with LimitedModelServer(rate, announce=announce,
                            tokens_per_minute=tokens_per_minute) as server:
        model = limited(server, ledger, claimed(ledger, "first"), max_pause)
        assert model.generate("hello").text == "hello"
    return server


def test_an_endpoint_with_nothing_configured_adopts_the_announced_rate(ledger: Ledger) -> None:
    """The server allows 10 a second and announces 600 a minute: the row's rate is 600 from
    the first answer, and its request bucket holds a second's worth at once."""
    answer_once(ledger, Limits())
    row = ledger.calls.endpoint_limit("ep")
    assert row is not None and row.answered_at is not None
    assert (row.rate, row.announced_requests_per_minute) == (600.0, 600.0)
    assert row.request_level == pytest.approx(10.0)


def test_an_announced_tokens_limit_is_adopted_for_the_tokens_bucket(ledger: Ledger) -> None:
    """600,000 tokens a minute announced: the tokens bucket is in force at it (the slot's
    decision reports it), the configured-none tokens limit stays none."""
    answer_once(ledger, Limits(), tokens_per_minute=600_000)
    row = ledger.calls.endpoint_limit("ep")
    assert row is not None and row.tokens_per_minute is None
    assert row.announced_tokens_per_minute == 600_000
    decision = ledger.calls.take_slot(Slot("ep", 100, 5.0))
    assert decision.granted and decision.tokens_per_minute == 600_000


@pytest.mark.parametrize("configured, in_force", [(120.0, 120.0), (1_200.0, 600.0)])
def test_the_lower_of_the_configured_and_the_announced_rate_is_in_force(
        ledger: Ledger, configured: float, in_force: float) -> None:
    """Configured 120 a minute, announced 600: 120 stays; configured 1,200, announced 600:
    the provider's 600 is in force at once. The configuration itself is kept either way."""
    answer_once(ledger, Limits(requests_per_minute=configured))
    row = ledger.calls.endpoint_limit("ep")
    assert row is not None and row.requests_per_minute == configured
    assert (row.rate, row.announced_requests_per_minute) == (in_force, 600.0)


def test_a_nearly_spent_quota_pauses_every_worker_before_the_provider_refuses(
        ledger: Ledger) -> None:
    """The answer announces its tokens quota spent (120 of 120 a minute used): the endpoint
    pauses until the reset, capped at 1.5 s; the next call leaves only after the pause, and
    the provider refuses nothing."""
    ledger.calls.configure_endpoint("ep", Limits())
    with LimitedModelServer(10, announce="openai", tokens_per_minute=120) as server:
        model = limited(server, ledger, claimed(ledger, "a"), max_pause=1.5)
        model.generate("first")
        row = ledger.calls.endpoint_limit("ep")
        assert row is not None and row.paused_until is not None and row.answered_at is not None
        assert row.answered_at + timedelta(seconds=1.4) < row.paused_until \
            <= row.answered_at + timedelta(seconds=1.6)
        other = limited(server, ledger, claimed(ledger, "b"), max_pause=1.5)
        other.generate("second")
    assert (len(server.seen.accepted), len(server.seen.refused)) == (2, 0)
    second = ledger.calls.of_run(run_id_of(ledger, "b"))[0]
    assert second.started_at is not None and second.started_at >= row.paused_until


def run_id_of(ledger: Ledger, subject: str) -> str:
    [run] = [r for r in ledger.runs(job="announced", limit=10) if r.subject == subject]
    return run.run_id


def test_a_second_process_starts_at_the_learned_rate(ledger: Ledger, db_url: str) -> None:
    """One connection learns 600 a minute from an answer; another ledger connection to the
    same database (a worker process starting later) configures the endpoint as a tick does
    and is granted a second's worth (10) at once, then waits a tenth of a second per call:
    no probe, no learning again."""
    answer_once(ledger, Limits())
    with Ledger.connect(db_url) as later:
        later.calls.configure_endpoint("ep", Limits())
        started = time.monotonic()
        granted = 0
        while (decision := later.calls.take_slot(Slot("ep", 10, 5.0))).granted:
            granted += 1
            assert granted <= 100
        elapsed = time.monotonic() - started
    # A second's worth at once, plus what refilled at 10 a second while asking.
    assert 10 <= granted <= 10 + 10 * elapsed + 1
    assert decision.rate == 600.0 and 0 < decision.wait_seconds(0.05) <= 0.1


def test_bad_headers_are_ignored_and_the_answer_counts(ledger: Ledger) -> None:
    """Headers of OpenAI's names that do not parse: the call is answered and recorded,
    nothing is learned and nothing paused; the endpoint knows it has answered."""
    answer_once(ledger, Limits(), announce="garbage")
    row = ledger.calls.endpoint_limit("ep")
    assert row is not None and row.answered_at is not None and row.paused_until is None
    assert (row.rate, row.announced_requests_per_minute, row.announced_tokens_per_minute) \
        == (None, None, None)
    [call] = ledger.calls.of_run(run_id_of(ledger, "first"))
    assert call.outcome == "answered"


def record(ledger: Ledger, subject: str) -> InFlight | None:
    """A call of ``subject`` recorded once the endpoint grants its slot now; None if not."""
    slot = Slot("ep", 10, 5.0)
    if not ledger.calls.take_slot(slot).granted:
        return None
    return ledger.calls.record_intent(claimed(ledger, subject),
                                      Intent("ep", "m", 0, DIGEST, slot=slot))


def test_an_endpoint_knowing_no_rate_sends_one_call_until_its_answer(ledger: Ledger) -> None:
    """Nothing configured or learned: the first call is granted, the next waits (a poll) while
    it is in flight, and goes once it has answered; a failed probe frees the endpoint too."""
    ledger.calls.configure_endpoint("ep", Limits())
    probe = record(ledger, "a")
    assert probe is not None
    waiting = ledger.calls.take_slot(Slot("ep", 10, 5.0))
    assert not waiting.granted and waiting.wait_seconds(0.05) == 0.05
    ledger.calls.endpoint_answered(probe, Usage(1, 1))
    assert record(ledger, "b") is not None and record(ledger, "c") is not None


def test_a_probe_that_failed_frees_the_endpoint_within_a_second(ledger: Ledger) -> None:
    """The probe's call fails (no answer, no refusal): the others go once it has an outcome
    and a second has passed since its slot (the time its record takes at most)."""
    ledger.calls.configure_endpoint("ep", Limits())
    probe = record(ledger, "a")
    assert probe is not None
    ledger.calls.record_failure(probe, "failed", "connection refused")
    deadline = datetime.now(UTC) + timedelta(seconds=5)
    while (second := record(ledger, "b")) is None:
        assert datetime.now(UTC) < deadline
    assert second is not None
