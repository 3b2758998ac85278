"""What a job owes and what reconcile decides, without I/O: DST weeks lose or double no
period, each policy decides missed occurrences, stranded Runs wait their backoff or are given
up, the cap defers work, and a scheduled tick is stale only when it starts too late."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import pytest

from flows.jobs import Candidate, Job
from flows.occurrences.plan import asked_for, first_owed, owed_occurrences, plan, redrive_delay
from flows.run_job.stale import stale_reason
from store import RunState


def make(**options: Any) -> Job:
    values: dict[str, Any] = {
        "name": "owed", "version": "1", "cadence": "daily", "timezone": "UTC",
        "subjects": ["acme"], "collect": lambda s, p: {}, "validate": lambda c: None,
        "transform": lambda r, m: Candidate("x", "m"), "messages": lambda s, p, o: [],
    }
    return Job(**{**values, **options})


def state(job: Job, day: datetime, status: str, attempts: int = 1, *,
          expired: bool = True, updated: datetime | None = None) -> RunState:
    identity = job.identity("acme", job.period_at(day))
    return RunState(identity.run_id, "acme", identity.period_start, "1", status, attempts,
                    updated or day, "TimeoutError: slow", expired)


@pytest.mark.parametrize(("timezone", "cadence", "start", "end", "expected"), [
    # Europe/Berlin falls back on 25 October 2026: that day (its local midnight to the
    # next) has 25 hours.
    ("Europe/Berlin", "hourly", datetime(2026, 10, 24, 22, tzinfo=UTC),
     datetime(2026, 10, 25, 22, 59, tzinfo=UTC), 25),
    # New York springs forward on 8 March 2026: that day has 23 hours.
    ("America/New_York", "hourly", datetime(2026, 3, 8, 5, tzinfo=UTC),
     datetime(2026, 3, 9, 3, 59, tzinfo=UTC), 23),
    ("America/New_York", "daily", datetime(2026, 10, 29, 4, tzinfo=UTC),
     datetime(2026, 11, 4, 12, tzinfo=UTC), 7),
    ("Europe/Berlin", "daily", datetime(2026, 3, 26, 23, tzinfo=UTC),
     datetime(2026, 4, 1, 12, tzinfo=UTC), 6),
])
def test_a_dst_week_owes_every_period_once(timezone: str, cadence: str, start: datetime,
                                          end: datetime, expected: int) -> None:
    """Consecutive, distinct periods across the change: the repeated fall-back hour is two
    periods, the skipped spring hour none."""
    job = make(timezone=timezone, cadence=cadence, start=start)
    owed = owed_occurrences(job, {"acme": job.period_at(start).start}, end)
    periods = [o.period for o in owed]
    assert len(periods) == expected
    assert all(a.end == b.start for a, b in pairwise(periods))
    assert len({p.start for p in periods}) == expected


def test_a_subject_is_owed_from_its_own_first_period_only() -> None:
    """globex, owed from Thursday, owes nothing before it while acme owes the whole week."""
    job = make(subjects=["acme", "globex"])
    monday = datetime(2026, 1, 5, tzinfo=UTC)
    owed = owed_occurrences(job, {"acme": monday, "globex": monday + timedelta(days=3)},
                            monday + timedelta(days=4, hours=12))
    assert sum(o.subject == "acme" for o in owed) == 5
    assert [o.period.label for o in owed if o.subject == "globex"] == ["2026-01-08", "2026-01-09"]


def test_a_new_job_is_owed_from_its_start_and_a_new_subject_from_now() -> None:
    """The job's start counts only while the ledger knows none of its subjects."""
    job = make(start=datetime(2026, 1, 1, 15, tzinfo=UTC))
    now = datetime(2026, 1, 9, 12, tzinfo=UTC)
    assert first_owed(job, now, {}) == datetime(2026, 1, 1, tzinfo=UTC)
    assert first_owed(job, now, {"acme": datetime(2026, 1, 1, tzinfo=UTC)}) == datetime(
        2026, 1, 9, tzinfo=UTC)


def test_a_subject_that_ran_before_reconcile_first_looked_is_owed_from_its_first_run() -> None:
    """A job ticking for days before its first reconcile pass owes every period since its first
    Run, not only from now: the periods it missed in between are not lost."""
    job = make()
    now = datetime(2026, 1, 9, 12, tzinfo=UTC)
    ran = datetime(2026, 1, 6, tzinfo=UTC)
    assert first_owed(job, now, {}, first_run=ran) == ran
    later = make(start=datetime(2026, 1, 4, tzinfo=UTC))
    assert first_owed(later, now, {}, first_run=ran) == datetime(2026, 1, 4, tzinfo=UTC)


@pytest.mark.parametrize(("policy", "expected"), [
    ("catch-up", ["run", "run", "run", "run"]),
    ("latest", ["skip", "skip", "skip", "run"]),
    ("skip", ["skip", "skip", "skip", "skip"]),
])
def test_the_policy_decides_the_missed_occurrences(policy: str, expected: list[str]) -> None:
    """Four days nobody started, all past their lateness: the policy picks what runs."""
    job = make(missed_runs=policy, catch_up_window=timedelta(days=3))
    now = datetime(2026, 1, 9, 12, tzinfo=UTC)
    owed = owed_occurrences(job, {"acme": datetime(2026, 1, 6, tzinfo=UTC)}, now)
    decided = plan(job, owed, {}, {}, now)
    assert [s.action for s in decided.steps] == expected
    assert all(s.state == "missed" and s.overdue for s in decided.steps)


def test_an_occurrence_within_its_lateness_is_left_to_its_schedule() -> None:
    """Due at 07:00 with an hour of lateness: at 07:30 nobody decides for the scheduler yet,
    but past its grace it is overdue."""
    job = make(due=timedelta(hours=7), grace=timedelta(minutes=20), max_lateness=timedelta(hours=1))
    now = datetime(2026, 1, 9, 7, 30, tzinfo=UTC)
    [step] = plan(job, owed_occurrences(job, {"acme": datetime(2026, 1, 9, tzinfo=UTC)}, now),
                  {}, {}, now).steps
    assert (step.state, step.action, step.overdue) == ("upcoming", "none", True)


def test_a_stranded_run_waits_its_backoff_then_is_re_driven_then_given_up() -> None:
    """After two attempts the wait is twice the base; past the attempt cap it is given up; a
    live lease or a finished Run is left alone."""
    job = make(max_attempts=3)
    day = datetime(2026, 1, 9, tzinfo=UTC)
    owed = owed_occurrences(job, {"acme": day}, day + timedelta(hours=12))

    def action(run: RunState, now: datetime) -> str:
        return plan(job, owed, {run.run_id: run}, {}, now,
                    backoff=timedelta(minutes=1)).steps[0].action

    changed = day + timedelta(hours=10)
    assert redrive_delay(2, timedelta(minutes=1), timedelta(hours=1)) == timedelta(minutes=2)
    assert action(state(job, day, "pending", 2, updated=changed), changed + timedelta(minutes=1)) == "wait"
    assert action(state(job, day, "pending", 2, updated=changed), changed + timedelta(minutes=2)) == "redrive"
    assert action(state(job, day, "running", 3, updated=changed), changed + timedelta(hours=1)) == "give-up"
    assert action(state(job, day, "running", 1, expired=False), changed) == "none"
    assert action(state(job, day, "failed", 1), changed) == "none"
    assert action(state(job, day, "completed", 1), changed) == "none"


def test_a_stranded_run_no_obligation_owes_is_re_driven_like_an_owed_one() -> None:
    """A Run of a period before the subject's obligation (run by hand, left over budget) is
    re-driven; one of another version, of a subject the job no longer lists, not yet due or
    finished is not."""
    job = make(subjects=["acme", "globex"])
    day = datetime(2026, 1, 9, tzinfo=UTC)
    now = day + timedelta(days=3)
    owed = owed_occurrences(job, {"acme": day + timedelta(days=2)}, now)
    stranded = state(job, day, "pending", 0, updated=day)
    other_version = RunState("v" * 64, "acme", day + timedelta(days=1), "0", "pending", 0, day,
                             None, False)
    gone = RunState("g" * 64, "initech", day, "1", "pending", 0, day, None, False)
    done = state(job, day - timedelta(days=1), "completed")
    future = state(job, now + timedelta(days=1), "pending", 0)
    runs = {r.run_id: r for r in (stranded, other_version, gone, done, future)}
    [extra] = asked_for(job, owed, runs, now)
    assert (extra.subject, extra.period.start, extra.identity.run_id) == (
        "acme", day, stranded.run_id)
    steps = plan(job, [extra, *owed], runs, {}, now).steps
    assert (steps[0].state, steps[0].action) == ("stranded", "redrive")


def test_the_cap_defers_the_newest_work_and_counts_it() -> None:
    """Ten days to catch up with a cap of four: the four oldest run, six wait for a pass."""
    job = make(missed_runs="catch-up", catch_up_window=timedelta(days=30))
    now = datetime(2026, 1, 11, 12, tzinfo=UTC)
    owed = owed_occurrences(job, {"acme": datetime(2026, 1, 2, tzinfo=UTC)}, now)
    decided = plan(job, owed, {}, {}, now, cap=4)
    assert [s.action for s in decided.steps] == ["run"] * 4 + ["wait"] * 6
    assert decided.capped == 6 and "cap of 4" in decided.steps[-1].reason


@pytest.mark.parametrize(("policy", "minutes_late", "latest", "stale"), [
    ("skip", 30, True, False),  # within its lateness: it runs
    ("skip", 90, True, True),
    ("latest", 90, True, False),  # the latest due period still runs
    ("latest", 90, False, True),
    ("catch-up", 60 * 72, False, False),
])
def test_a_scheduled_tick_is_stale_only_when_it_starts_too_late(
        policy: str, minutes_late: int, latest: bool, stale: bool) -> None:
    """Lateness is the start against the flow run's expected start (its slot), so a Quick run
    (expected now) is never stale; the reason says how to run it anyway."""
    job = make(missed_runs=policy, due=timedelta(hours=7), max_lateness=timedelta(hours=1))
    monday = job.parse_period("2026-01-05")
    slot = job.due_at(monday)
    now = slot + timedelta(minutes=minutes_late)
    if not latest:  # Tuesday's slot has passed too: Monday is no longer the latest due
        now += timedelta(days=1)
    reason = stale_reason(job, monday, slot, now)
    assert (reason is not None) == stale
    if reason is not None:
        assert "period=2026-01-05" in reason and "backfill" in reason
    assert stale_reason(job, monday, now, now) is None  # a run made now is not late
