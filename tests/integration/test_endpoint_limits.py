"""An endpoint's shared limits on both ledgers: acquisitions never take more than the buckets
and the calls in flight allow; a refusal pauses every acquisition until the time the provider
named (capped); a call refused with 429 is tried again in-process after the pause; two worker
processes sharing one endpoint never exceed it together, and a 429 with Retry-After: 3 stops
both for 3 s; a provider allowing half the configured rate still sees the tick complete; an
unknown endpoint is refused with the known ones listed, nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prefect.client.schemas.objects import State

from bench.limited_provider import Arrivals, LimitedModelServer
from flows.errors import is_transient
from flows.model import (
    CallCount,
    EndpointLimiter,
    EndpointRefusing,
    ModelEndpoint,
    RecordedModel,
    UnknownEndpoint,
    endpoint_named,
)
from flows.model.openai_compatible import OpenAICompatibleModel
from flows.prices import PriceList
from flows.run_job.outcomes import TickReport
from flows.settings import RunledgerSettings
from store import (
    Claim,
    InFlight,
    Intent,
    Ledger,
    Limits,
    RunIdentity,
    Slot,
    SlotUnavailable,
    Usage,
)
from store.endpoint_limits import SlotDecision, take_slot_txn
from tests.support.ledger import model_calls, register_and_claim, wait_for_db_clock
from tests.support.pipeline import Env, outcomes, pipeline_env, probe_job

ROOT = Path(__file__).parents[2]
PERIOD = datetime(2026, 12, 2, tzinfo=UTC)
DIGEST = "0" * 64
ENDPOINT = "default"


def claim_of(ledger: Ledger, subject: str) -> Any:
    claim = register_and_claim(ledger, RunIdentity("limits", subject, PERIOD, "v1"),
                               owner="w:1", lease=timedelta(minutes=5)).claim
    assert claim is not None
    return claim


def record_when_allowed(ledger: Ledger, claim: Claim, slot: Slot) -> InFlight | SlotDecision:
    """The call recorded with its slot of an endpoint that bounds its calls in flight, or the
    decision that said how long to wait."""
    try:
        return ledger.calls.record_intent(claim, Intent("ep", "m", 0, DIGEST, slot=slot))
    except SlotUnavailable as unavailable:
        return unavailable.decision


def take(ledger: Ledger, subject: str, tokens: int = 10) -> InFlight | SlotDecision:
    return record_when_allowed(ledger, claim_of(ledger, subject),
                               Slot("ep", tokens, 60.0, bounds_in_flight=True))


def test_acquisitions_take_no_more_than_the_request_bucket_holds(ledger: Ledger) -> None:
    """6 a minute (a bucket of 1, refilled in 10 s): the first call goes, the next waits for the
    refill, and nothing of the refused one is recorded."""
    ledger.calls.configure_endpoint("ep", Limits(requests_per_minute=6))
    assert isinstance(take(ledger, "a"), InFlight)
    refused = take(ledger, "b")
    assert isinstance(refused, SlotDecision) and not refused.granted
    assert 0 < refused.wait_seconds(0.05) <= 10.0
    assert [c["subject"] for c in model_calls(ledger)] == ["a"]
    row = ledger.calls.endpoint_limit("ep")
    assert row is not None and row.calls == 1


def test_a_slot_taken_while_another_taker_holds_the_row_counts_the_slot_that_taker_took(
        ledger: Ledger) -> None:
    """6 a minute (a bucket of 1, refilled in 10 s), no bound on calls in flight: a taker that
    waits on the row for another's uncommitted slot goes on from the level that slot left, and
    is refused."""
    ledger.calls.configure_endpoint("ep", Limits(requests_per_minute=6))
    slot = Slot("ep", 10, 60.0)
    with ThreadPoolExecutor(1) as pool, ledger.engine.connect() as holder:
        with holder.begin():
            assert take_slot_txn(holder, slot).granted
            waiting = pool.submit(ledger.calls.take_slot, slot)
            time.sleep(0.5)  # the second taker reaches the row and waits on it
            assert not waiting.done()
        second = waiting.result(timeout=30)
    assert not second.granted and 0 < second.wait_seconds(0.05) <= 10.0
    row = ledger.calls.endpoint_limit("ep")
    assert row is not None and row.calls == 1


def test_no_more_calls_than_the_maximum_are_in_flight_and_an_ended_one_frees_its_slot(
        ledger: Ledger) -> None:
    """Two in flight at most: the third waits (a poll) until one of the two has an outcome."""
    ledger.calls.configure_endpoint("ep", Limits(max_concurrent=2))
    first, second = take(ledger, "a"), take(ledger, "b")
    assert isinstance(first, InFlight) and isinstance(second, InFlight)
    third = take(ledger, "c")
    assert isinstance(third, SlotDecision) and third.wait_seconds(0.05) == 0.05
    ledger.calls.record_failure(first, "failed", "timed out")
    assert isinstance(take(ledger, "d"), InFlight)


def test_a_call_in_flight_of_a_killed_worker_stops_counting_after_the_model_timeout(
        ledger: Ledger) -> None:
    """A call with no outcome that started longer ago than the in-flight window (the model
    timeout) no longer holds a slot: a SIGKILLed worker leaks nothing."""
    ledger.calls.configure_endpoint("ep", Limits(max_concurrent=1))
    claim = claim_of(ledger, "a")
    first = record_when_allowed(ledger, claim, Slot("ep", 10, 60.0, bounds_in_flight=True))
    assert isinstance(first, InFlight)
    assert isinstance(take(ledger, "b"), SlotDecision)
    # The same call seen with a window of a millisecond, once it started longer ago than that.
    started = ledger.calls.of_run(claim.run_id)[0].started_at
    assert started is not None
    wait_for_db_clock(ledger, started + timedelta(milliseconds=2))
    later = record_when_allowed(ledger, claim_of(ledger, "c"),
                                Slot("ep", 10, 0.001, bounds_in_flight=True))
    assert isinstance(later, InFlight)


def test_tokens_per_minute_are_taken_by_estimate_and_settled_to_the_real_usage(
        ledger: Ledger) -> None:
    """6,000 tokens a minute (100 a second): a call estimated at 100 empties the bucket; its
    answer reporting 30 gives 70 back."""
    ledger.calls.configure_endpoint("ep", Limits(tokens_per_minute=6_000))
    call = take(ledger, "a", tokens=100)
    assert isinstance(call, InFlight)
    before = ledger.calls.endpoint_limit("ep")
    assert before is not None and before.token_level < 1
    ledger.calls.endpoint_answered(call, Usage(20, 10))
    after = ledger.calls.endpoint_limit("ep")
    assert after is not None and after.token_level == pytest.approx(before.token_level + 70)


def test_a_refusal_pauses_every_acquisition_until_the_time_named_and_cuts_the_rate_once(
        ledger: Ledger) -> None:
    """A 429 asking 30 s: acquisitions wait until then (the ledger's clock); a second refusal
    during the pause does not cut the rate again, nor shorten the pause."""
    ledger.calls.configure_endpoint("ep", Limits(requests_per_minute=6_000))
    call = take(ledger, "a")
    assert isinstance(call, InFlight)
    until = ledger.calls.endpoint_refused(call, 30.0, 60.0)
    assert until is not None
    waiting = take(ledger, "b")
    assert isinstance(waiting, SlotDecision)
    assert waiting.paused_until == until
    assert waiting.wait_seconds(0.05) == (until - waiting.now).total_seconds()
    assert 0 < waiting.wait_seconds(0.05) <= 30.0
    assert ledger.calls.endpoint_refused(call, 1.0, 60.0) == until
    row = ledger.calls.endpoint_limit("ep")
    assert row is not None and (row.rate, row.refused) == (4_200, 2)


def test_configuring_the_same_limits_again_keeps_the_learned_rate(ledger: Ledger) -> None:
    """Each tick configures its endpoint: the same limits keep the adapted rate, new ones
    start over."""
    ledger.calls.configure_endpoint("ep", Limits(requests_per_minute=6_000))
    call = take(ledger, "a")
    assert isinstance(call, InFlight)
    ledger.calls.endpoint_refused(call, 0.0, 60.0)
    ledger.calls.configure_endpoint("ep", Limits(requests_per_minute=6_000))
    assert (row := ledger.calls.endpoint_limit("ep")) is not None and row.rate == 4_200
    ledger.calls.configure_endpoint("ep", Limits(requests_per_minute=1_200))
    assert (row := ledger.calls.endpoint_limit("ep")) is not None and row.rate == 1_200


def limited(server: LimitedModelServer, ledger: Ledger, claim: Any, *,
            max_pause: float = 60.0, refused_for: float = 300.0) -> RecordedModel:
    inner = OpenAICompatibleModel(server.base_url, "probe-model", timeout_seconds=5)
    limiter = EndpointLimiter(ledger.calls, "ep", in_flight_seconds=5,
                              max_pause_seconds=max_pause, bounds_in_flight=False)
    return RecordedModel(inner, ledger.calls, claim, PriceList(), CallCount(), limiter=limiter,
                         refused_for_seconds=refused_for)


@pytest.mark.parametrize("retry_after, max_pause, longest", [
    ("31536000", 0.5, 1.0), ("soon", 60.0, 2.0)])
def test_a_refused_call_is_tried_again_after_a_capped_pause_without_the_runs_retries(
        ledger: Ledger, retry_after: str, max_pause: float, longest: float) -> None:
    """A 429 asking a year is capped (RUNLEDGER_MAX_RETRY_AFTER_SECONDS, 0.5 s here); one of
    garbage is a backoff (1 s); either way the call is made again in-process and answered,
    both requests recorded at the same position."""
    ledger.calls.configure_endpoint("ep", Limits())
    claim = claim_of(ledger, "a")
    with LimitedModelServer(None, refuse_at={1: retry_after}) as server:
        model = limited(server, ledger, claim, max_pause=max_pause)
        assert model.generate("hello").text == "hello"
    calls = ledger.calls.of_run(claim.run_id)
    assert [(c.position, c.outcome) for c in calls] == [(0, "refused"), (0, "answered")]
    row = ledger.calls.endpoint_limit("ep")
    assert row is not None and row.paused_until is not None and calls[0].finished_at
    assert calls[0].finished_at < row.paused_until < calls[0].finished_at + timedelta(
        seconds=longest)
    assert calls[1].started_at is not None and calls[1].started_at >= row.paused_until
    assert model.spent.made == 2


def test_a_provider_refusing_longer_than_the_bound_ends_the_call_as_transient(
        ledger: Ledger) -> None:
    """Refusals for longer than RUNLEDGER_MODEL_REFUSED_FOR_SECONDS: EndpointRefusing, a
    transient failure (for reconcile), never a permanent one."""
    ledger.calls.configure_endpoint("ep", Limits())
    claim = claim_of(ledger, "a")
    with LimitedModelServer(None, refuse_at={1: "0.3", 2: "0.3", 3: "0.3"}) as server:
        model = limited(server, ledger, claim, refused_for=0.2)
        with pytest.raises(EndpointRefusing) as refused:
            model.generate("hello")
    assert is_transient(refused.value)
    assert all(c.outcome == "refused" for c in ledger.calls.of_run(claim.run_id))


@pytest.fixture
def env(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        prefect_api: str) -> Iterator[Env]:
    with pipeline_env(db_url, tmp_path, monkeypatch) as found:
        yield found


def openai_settings(env: Env, server: LimitedModelServer, **limits: Any) -> None:
    env.set(model="openai", model_base_url=server.base_url, model_name="probe-model",
            model_timeout_seconds=10, **{f"model_{k}": v for k, v in limits.items()})


def tick_processes(env: Env, prefect_api: str, jobs: list[str], size: int,
                   period: str) -> list[dict[str, Any]]:
    """One tick of a job of ``size`` subjects per name, each in a worker process of its own,
    started together; their JSON reports."""
    environment = {**os.environ, "PREFECT_API_URL": prefect_api, "PYTHONPATH": str(ROOT),
                   "PREFECT_HOME": str(env.source.parent / "prefect-client"),
                   "PREFECT_LOGGING_LEVEL": "WARNING"}
    started = [subprocess.Popen(
        [sys.executable, "-m", "bench.volume_tick", job, str(size), period],
        env=environment, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for job in jobs]
    reports = []
    for process in started:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


@pytest.mark.processes
def test_two_worker_processes_sharing_an_endpoint_never_exceed_its_limit_together(
        env: Env, prefect_api: str) -> None:
    """Two jobs on one endpoint of 10 calls a second, each ticking 30 subjects in a process
    of its own with 8 threads against a 0.2 s model (alone, each would make 40 a second):
    together they never start more than the bucket's 10 plus 10 refilled within any second
    (the ledger's clock), and the server, allowing 12 a second, refuses none."""
    with LimitedModelServer(12, latency=0.2, burst=2.0) as server:
        openai_settings(env, server, requests_per_minute=600)
        reports = tick_processes(env, prefect_api, ["limits-a", "limits-b"], 30, "2026-12-01")
    assert [r["outcomes"] for r in reports] == [{"new": 30}, {"new": 30}]
    assert (len(server.seen.accepted), len(server.seen.refused)) == (60, 0)
    calls = env.calls()
    started = Arrivals(accepted=[c["started_at"].timestamp() for c in calls])
    assert started.most_in_any_second() <= 20
    assert len({c["pid"] for c in calls}) == 2


@pytest.mark.processes
def test_a_429_with_retry_after_3_stops_both_processes_for_3_seconds(
        env: Env, prefect_api: str) -> None:
    """Two processes sharing 5 calls a second; the 25th call is refused with Retry-After: 3:
    no call of either process starts (on the ledger's clock) nor reaches the server during the
    pause; every process with Runs left goes on after it; every Run completes; the refused request stays recorded."""
    with LimitedModelServer(None, latency=0.2, refuse_at={25: "3"}) as server:
        openai_settings(env, server, requests_per_minute=300)
        reports = tick_processes(env, prefect_api, ["pause-a", "pause-b"], 20, "2026-12-01")
    assert [r["outcomes"] for r in reports] == [{"new": 20}, {"new": 20}]
    row = env.ledger.calls.endpoint_limit(ENDPOINT)
    assert row is not None and row.paused_until is not None and row.refused == 1
    calls = env.calls()
    refused = [c for c in calls if c["outcome"] == "refused"]
    assert len(refused) == 1 and len(calls) == 41
    paused_from = row.paused_until - timedelta(seconds=3)  # a Retry-After of 3, uncapped
    assert refused[0]["finished_at"] <= paused_from
    assert [c for c in calls if paused_from <= c["started_at"] < row.paused_until] == []
    # The server and the ledger share this host's clock: every request that reached the
    # server before the pause ended is one the ledger recorded before the pause began.
    reached = [at for at in server.seen.accepted + server.seen.refused
               if at < row.paused_until.timestamp()]
    assert len(reached) == len([c for c in calls if c["started_at"] < paused_from])
    # Which processes still had Runs to answer at the pause depends on how the two started
    # (one may finish before the other reaches its first call); each such process goes on after.
    answered_before = Counter(c["pid"] for c in calls
                              if c["outcome"] != "refused" and c["started_at"] < paused_from)
    owing = {c["pid"] for c in calls if answered_before[c["pid"]] < 20}
    after = {c["pid"] for c in calls if c["started_at"] >= row.paused_until}
    assert refused[0]["pid"] in owing and after == owing


def run_tick(env: Env, job: str, period: str) -> tuple[State[Any], TickReport | BaseException]:
    return env.run(job, None, period)


def test_a_provider_allowing_half_the_configured_rate_still_completes_the_tick(
        env: Env) -> None:
    """Configured 20 a second, the provider takes 10 (429 with Retry-After: 1 beyond): every
    Run completes, none fails, and the refusals stay well below the calls."""
    probe = probe_job([f"s{i}" for i in range(60)])
    with LimitedModelServer(10, latency=0.1) as server:
        openai_settings(env, server, requests_per_minute=1_200, max_concurrent=16)
        state, report = run_tick(env, probe.name, "2026-12-01")
    assert state.name == "Completed", state
    assert set(outcomes(report).values()) == {"new"}
    calls = Counter(c["outcome"] for c in env.calls())
    assert calls["answered"] == 60, calls
    # The provider took each answered request, and none the ledger did not record: on a
    # loaded machine a reply can come after the timeout, that call then asked again.
    assert 60 <= len(server.seen.accepted) <= calls.total() - calls["refused"], calls
    assert len(server.seen.refused) <= 15, len(server.seen.refused)


def test_an_unknown_endpoint_is_refused_naming_the_known_ones_and_nothing_is_written(
        env: Env) -> None:
    """Job(endpoint="nowhere"): the tick fails before any Run is registered, and the error
    lists default, the configured endpoints and the saved blocks."""
    ModelEndpoint(base_url="http://127.0.0.1:9/v1", model_name="m",
                  requests_per_minute=60).save("saved-endpoint", overwrite=True)
    env.set(endpoints=json.dumps({"fast": {"base_url": "http://127.0.0.1:9/v1",
                                           "model_name": "m"}}))
    with pytest.raises(UnknownEndpoint) as unknown:
        endpoint_named("nowhere", RunledgerSettings())
    assert "default, fast, saved-endpoint" in str(unknown.value)
    saved = endpoint_named("saved-endpoint", RunledgerSettings())
    assert saved.limits == Limits(60, None, None)
    probe = probe_job(["acme"], endpoint="nowhere")
    state, _ = run_tick(env, probe.name, "2026-12-01")
    assert state.is_failed() and "known endpoints: default, fast" in (state.message or "")
    assert env.ledger.runs(job=probe.name) == []
