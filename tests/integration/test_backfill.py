"""The backfill flow on the session's Prefect server and real ledgers (SQLite and PostgreSQL):
every period of a range run once as a run-job subflow, resumable, with reprocess, dry run,
Prefect's concurrency and rate limits, refusals and cancellation."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime
from typing import Any
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    FlowRunFilter,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.responses import GlobalConcurrencyLimitResponse
from prefect.concurrency.asyncio import concurrency
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.exceptions import ObjectNotFound

from flows.backfill.flow import backfill
from flows.backfill.limits import limit_names
from flows.backfill.report import BackfillReport
from flows.jobs import PermanentError
from flows.run_job.outcomes import outcome_name
from store import Ledger
from tests.support.pipeline import Env, Probe, final_state, probe_job, wait_until

DAYS = ("2026-01-01", "2026-01-04")
postgres_only = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)


def run_backfill(job: str, start: str = DAYS[0], end: str = DAYS[1],
                 **options: Any) -> tuple[str, BackfillReport | BaseException]:
    state = final_state(backfill(job=job, start=start, end=end, return_state=True, **options))
    return outcome_name(state), state.result(raise_on_failure=False)


def report_of(value: BackfillReport | BaseException) -> BackfillReport:
    assert isinstance(value, BackfillReport), value
    return value


def job_flow_runs(job: str) -> list[FlowRun]:
    """The run-job flow runs of ``job`` on the Prefect server (run-job tags them job:NAME)."""
    async def read() -> list[FlowRun]:
        async with get_client() as client:
            return await client.read_flow_runs(flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[f"job:{job}"])))
    return asyncio.run(read())


def read_limit(name: str) -> GlobalConcurrencyLimitResponse | None:
    async def read() -> GlobalConcurrencyLimitResponse | None:
        async with get_client() as client:
            try:
                return await client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                return None
    return asyncio.run(read())


def acquired_at(limit_id: UUID, count: int) -> list[datetime]:
    """When this process was granted slots of the limit, from Prefect's own events."""
    def found() -> list[datetime]:
        with get_client(sync_client=True) as client:
            events = client.read_events(EventFilter(
                event=EventNameFilter(name=["prefect.concurrency-limit.acquired"]),
                resource=EventResourceFilter(id=[f"prefect.concurrency-limit.{limit_id}"]),
            ), limit=50).events
        return sorted(e.occurred for e in events)
    wait_until(lambda: len(found()) == count, 120, f"{count} acquisition events")
    return found()


def snapshot(ledger: Ledger, job: str) -> tuple[list[Any], list[Any]]:
    since = ledger.now().replace(year=2000)
    return ([r.model_dump() for r in ledger.runs(job=job, limit=10_000)],
            [o.model_dump() for o in ledger.occurrences.list(job, since)])


def statuses(ledger: Ledger, job: str) -> dict[tuple[str, str], str]:
    return {(r.subject, r.period_start.date().isoformat()): r.status
            for r in ledger.runs(job=job, limit=10_000)}


def two_subjects(**options: Any) -> Probe:
    return probe_job(("acme", "globex"), **options)


def test_a_backfill_of_four_days_and_two_subjects_completes_eight_runs_with_eight_model_calls(
        env: Env) -> None:
    """Each day is its own run-job subflow with an explicit period; every Run completes once."""
    probe = two_subjects()
    name, value = run_backfill(probe.name)
    report = report_of(value)
    assert name == "Completed"
    assert report.counts() == {"new": 8}
    assert [r.label for r in report.results] == [
        "2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"]
    assert set(statuses(env.ledger, probe.name).values()) == {"completed"}
    assert len(statuses(env.ledger, probe.name)) == 8 and env.model_calls() == 8
    runs = job_flow_runs(probe.name)
    assert sorted(r.parameters["period"] for r in runs) == [r.label for r in report.results]
    assert {str(r.id) for r in runs} == {r.flow_run_id for r in report.results}
    with get_client(sync_client=True) as client:
        [progress] = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[f"backfill-{probe.name}"])))
    assert progress.type == "progress" and progress.data == 100.0


def test_a_backfill_resumes_where_it_stopped_and_again_runs_nothing_without_a_task_run(
        env: Env) -> None:
    """After the first two days, the whole range runs only the last two; once all are
    completed the same backfill calls no model and starts no subflow nor task run."""
    probe = two_subjects()
    report_of(run_backfill(probe.name, DAYS[0], "2026-01-02")[1])
    assert env.model_calls() == 4
    resumed = report_of(run_backfill(probe.name)[1])
    assert resumed.counts() == {"new": 4, "duplicate": 4}
    assert [r.flow_run_id is not None for r in resumed.results] == [False, False, True, True]
    assert env.model_calls() == 8 and len(job_flow_runs(probe.name)) == 4
    name, again = run_backfill(probe.name)
    assert name == "Completed" and report_of(again).counts() == {"duplicate": 8}
    assert env.model_calls() == 8 and len(job_flow_runs(probe.name)) == 4
    assert probe.collects.count("acme") == 4


def test_a_permanently_failed_run_stays_failed_unless_reprocess_failed_requeues_it(
        env: Env) -> None:
    """reprocess=none reports the failed Run and leaves it; reprocess=failed requeues it
    first and completes it, with one more model call and nothing else run."""
    probe = two_subjects(transform_errors=[PermanentError("the source is unreadable")])
    name, first = run_backfill(probe.name, max_active=1)
    assert name == "Failed" and report_of(first).counts() == {"new": 7, "failed": 1}
    [failed] = [k for k, v in statuses(env.ledger, probe.name).items() if v == "failed"]
    calls = env.model_calls()
    name, kept = run_backfill(probe.name)
    assert name == "Failed" and report_of(kept).counts() == {"duplicate": 7, "failed": 1}
    assert all(r.flow_run_id is None for r in report_of(kept).results)
    assert statuses(env.ledger, probe.name)[failed] == "failed"
    name, redone = run_backfill(probe.name, reprocess="failed")
    assert name == "Completed" and report_of(redone).counts() == {"duplicate": 7, "new": 1}
    assert statuses(env.ledger, probe.name)[failed] == "completed"
    assert env.model_calls() == calls + 1


def test_a_skipped_occurrence_is_left_by_reprocess_none_and_run_by_reprocess_skipped(
        env: Env) -> None:
    """A skip recorded by the missed-run policy holds for a plain backfill; reprocess=skipped
    clears it and runs that occurrence."""
    probe = two_subjects()
    period = probe.job.parse_period("2026-01-02")
    identity = probe.job.identity("globex", period)
    assert env.ledger.occurrences.skip([(identity, "missed: policy skip")]) == [identity.run_id]
    name, plain = run_backfill(probe.name)
    assert name == "Completed" and report_of(plain).counts() == {"new": 7, "skipped": 1}
    assert ("globex", "2026-01-02") not in statuses(env.ledger, probe.name)
    name, redone = run_backfill(probe.name, reprocess="skipped")
    assert name == "Completed" and report_of(redone).counts() == {"duplicate": 7, "new": 1}
    assert statuses(env.ledger, probe.name)[("globex", "2026-01-02")] == "completed"
    [occurrence] = env.ledger.occurrences.list(probe.name, period.start)
    assert occurrence.skipped_at is None


def test_a_dry_run_writes_nothing_and_lists_what_would_run(env: Env) -> None:
    """The plan per period (to run, completed, failed, skipped); the ledger, the run-job flow
    runs and the Prefect limits are as before."""
    probe = two_subjects()
    report_of(run_backfill(probe.name, DAYS[0], DAYS[0])[1])
    env.ledger.occurrences.skip([(probe.job.identity("acme", probe.job.parse_period("2026-01-03")), "x")])
    before = snapshot(env.ledger, probe.name)
    name, value = run_backfill(probe.name, reprocess="none", dry_run=True, max_active=3)
    report = report_of(value)
    assert name == "DryRun" and report.results == []
    assert [(p["period"], p["run"], p["completed"], p["skipped"])
            for p in report.as_dict()["plan"]] == [
        ("2026-01-01", [], ["acme", "globex"], []),
        ("2026-01-02", ["acme", "globex"], [], []),
        ("2026-01-03", ["globex"], [], ["acme"]),
        ("2026-01-04", ["acme", "globex"], [], []),
    ]
    assert "5 to run, 2 completed, 1 skipped" in report.summary()
    assert snapshot(env.ledger, probe.name) == before
    assert len(job_flow_runs(probe.name)) == 1 and env.model_calls() == 2
    assert read_limit(limit_names(probe.name)[0]).limit == 2  # type: ignore[union-attr]


@postgres_only
@pytest.mark.parametrize(("options", "message"), [
    ({"start": "2026-01-04", "end": "2026-01-01"},
     "end 2026-01-01 is before start 2026-01-04: the start (--from) must be the earlier"),
    ({"subjects": ["acme", "initech"]}, "has no subject 'initech'"),
    ({"end": "2099-01-01"}, "is not due until 2099-01-01 00:00 UTC"),
    ({"start": "1990-01-01"}, "more than 10000 periods"),
    ({"start": "2026-13-01"}, "2026-13-01"),
    ({"reprocess": "completed"}, "reprocess: Input should be 'none', 'failed' or 'skipped'"),
    ({"max_active": 0}, "max_active must be a whole number of 1 or more"),
    ({"rate_per_minute": 0}, "more than 0 periods a minute"),
], ids=["end-before-start", "unknown-subject", "future", "too-many", "bad-date",
        "bad-reprocess", "bad-max-active", "bad-rate"])
def test_a_backfill_with_bad_parameters_is_refused_with_the_fix_and_writes_nothing(
        env: Env, options: dict[str, Any], message: str) -> None:
    """The flow run fails before anything runs, naming the parameter; no Run, no limit."""
    probe = two_subjects()
    state = final_state(backfill(job=probe.name, **{"start": DAYS[0], "end": DAYS[1], **options},
                                 return_state=True))
    error = state.result(raise_on_failure=False)
    assert state.is_failed() and isinstance(error, Exception)
    assert message in str(error)
    assert env.ledger.runs(job=probe.name) == [] and probe.collects == []
    assert read_limit(limit_names(probe.name)[0]) is None


@postgres_only
def test_max_active_and_the_rate_are_prefect_global_concurrency_limits_of_the_job(
        env: Env) -> None:
    """backfill-JOB holds max_active slots; backfill-JOB:rate decays rate/60 slots a second,
    one at a time, so the k-th period starts at least k * 60/rate seconds after the first even
    with slots free; a later backfill updates both."""
    probe = probe_job(("acme",))
    active, rate = limit_names(probe.name)
    report = report_of(run_backfill(probe.name, "2026-01-01", "2026-01-03", max_active=3,
                                    rate_per_minute=30)[1])
    assert report.counts() == {"new": 3}
    found, decaying = read_limit(active), read_limit(rate)
    assert found is not None and (found.limit, found.slot_decay_per_second) == (3, 0)
    assert decaying is not None and (decaying.limit, decaying.slot_decay_per_second) == (1, 0.5)
    # The events carry the client's clock, stamped after each grant returns: a late stamp can
    # shorten a gap between two grants. The k-th rate grant's stamp is never earlier than the
    # first held max_active slot (taken before any rate request) plus 2 s per earlier grant.
    first_request = min(acquired_at(found.id, 3))
    granted = acquired_at(decaying.id, 3)
    assert [(at - first_request).total_seconds() >= 2 * k - 0.1
            for k, at in enumerate(granted)] == [True, True, True]
    report_of(run_backfill(probe.name, "2026-01-04", "2026-01-04", max_active=1,
                           rate_per_minute=120)[1])
    found, decaying = read_limit(active), read_limit(rate)
    assert found is not None and decaying is not None
    assert (found.limit, decaying.slot_decay_per_second) == (1, 2.0)


@postgres_only
def test_a_backfill_waits_for_a_slot_another_backfill_of_the_job_holds(env: Env) -> None:
    """The limit is Prefect's, not this process's: while someone else holds the only slot of
    backfill-JOB, no period starts; once it is given back, the backfill runs."""
    probe = probe_job(("acme",))
    active, _ = limit_names(probe.name)
    report_of(run_backfill(probe.name, DAYS[0], DAYS[0], max_active=1)[1])  # makes the limit
    held, release = threading.Event(), threading.Event()

    async def hold() -> None:
        async with concurrency(active, occupy=1, strict=True):
            held.set()
            await asyncio.to_thread(release.wait)

    holder = threading.Thread(target=asyncio.run, args=(hold(),))
    holder.start()
    try:
        assert held.wait(30)
        results: list[BackfillReport | BaseException] = []
        runner = threading.Thread(target=lambda: results.append(
            run_backfill(probe.name, "2026-01-02", "2026-01-02", max_active=1)[1]))
        runner.start()
        # What is asserted is that nothing happens while the slot is held: no condition to poll,
        # so the backfill gets a fixed 3 s to start a period it must not start.
        time.sleep(3)
        assert len(env.ledger.runs(job=probe.name)) == 1 and runner.is_alive()
    finally:
        release.set()
        holder.join(30)
    runner.join(90)
    assert report_of(results[0]).counts() == {"new": 1}


@postgres_only
def test_a_cancelled_backfill_starts_no_further_period_and_leaves_no_run_claimed(
        env: Env) -> None:
    """Cancelled while the first period collects: that period's Run is released (pending, no
    lease), and no later period is ever registered."""
    collecting = threading.Event()

    def collect(subject: str) -> None:
        collecting.set()
        time.sleep(1)
    probe = probe_job(("acme",), on_collect=collect)

    async def cancel_during_first_period() -> None:
        task = asyncio.create_task(backfill(job=probe.name, start=DAYS[0], end=DAYS[1],
                                            max_active=1))
        await asyncio.to_thread(collecting.wait, 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_during_first_period())
    runs = env.ledger.runs(job=probe.name)
    assert [r.period_start.date().isoformat() for r in runs] == ["2026-01-01"]
    assert runs[0].status in ("pending", "completed") and runs[0].lease_expires_at is None
    assert probe.collects == ["acme"] and env.model_calls() <= 1
