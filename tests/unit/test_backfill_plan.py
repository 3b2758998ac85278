"""A backfill's checks and plan, without I/O: which periods a range covers (in the job's
timezone), what each reprocess mode runs, and the refusals, with "now" given."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from flows.backfill.plan import plan
from flows.backfill.request import InvalidBackfill, check, parse_rate, periods_between
from flows.errors import PeriodNotDue, UnknownSubject
from store import Occurrence, RunState
from tests.unit.test_job import make

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def run_state(job: Any, subject: str, day: str, status: str) -> RunState:
    period = job.parse_period(day)
    return RunState(job.identity(subject, period).run_id, subject, period.start, job.version,
                    status, 1, NOW, None, False)


def skip(job: Any, subject: str, day: str) -> Occurrence:
    identity = job.identity(subject, job.parse_period(day))
    return Occurrence(run_id=identity.run_id, job=job.name, subject=subject,
                      period_start=identity.period_start, version=job.version,
                      skipped_at=NOW, skip_reason="missed")


def test_a_range_covers_every_period_from_the_one_containing_start_to_the_one_containing_end(
        ) -> None:
    """Both ends are included, oldest first; a datetime names the period containing it."""
    job = make()
    labels = [p.label for p in periods_between(job, "2026-03-28", "2026-03-30T12:00:00+02:00",
                                               NOW)]
    assert labels == ["2026-03-28", "2026-03-29", "2026-03-30"]
    assert [p.label for p in periods_between(job, "2026-03-28", "2026-03-28", NOW)] == [
        "2026-03-28"]


def test_an_hourly_backfill_of_the_autumn_dst_day_has_twenty_five_periods() -> None:
    """Periods are counted in the job's timezone: Paris repeats 02:00 on 2026-10-25."""
    job = make(cadence="hourly")
    periods = periods_between(job, "2026-10-25T00:00:00+02:00", "2026-10-25T23:00:00+01:00", NOW)
    assert len(periods) == 25 and len({p.start for p in periods}) == 25


@pytest.mark.parametrize(("start", "end", "message"), [
    ("2026-01-04", "2026-01-01", "end 2026-01-01 is before start 2026-01-04"),
    ("1990-01-01", "2026-01-01", "more than 10000 periods of job probe (daily); split it"),
])
def test_a_range_backwards_in_the_future_or_too_long_is_refused(
        start: str, end: str, message: str) -> None:
    """Each refusal names the range and what to change."""
    with pytest.raises(InvalidBackfill, match=re.escape(message)):
        periods_between(make(), start, end, NOW)


def test_a_due_period_may_be_backfilled_but_not_one_not_yet_due_unless_allowed() -> None:
    """"Now" is given: the period containing it is due (due 0), the next is refused naming
    the flag and the parameter, and runs when the person allows it."""
    assert [p.label for p in periods_between(make(), "2026-12-01", "2026-12-01", NOW)] == [
        "2026-12-01"]
    with pytest.raises(PeriodNotDue, match=r"period 2026-12-02 of job probe is not due until .*"
                                           r"--allow-not-due \(CLI\) or the parameter "
                                           r"allow_not_due=true"):
        periods_between(make(), "2026-12-01", "2026-12-02", NOW)
    allowed = periods_between(make(), "2026-12-01", "2026-12-02", NOW, allow_not_due=True)
    assert [p.label for p in allowed] == ["2026-12-01", "2026-12-02"]


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"subjects": ["initech"]}, UnknownSubject, "has no subject 'initech'"),
    ({"reprocess": "completed"}, InvalidBackfill, "reprocess must be one of none, failed"),
    ({"max_active": 0}, InvalidBackfill, "max_active must be a whole number"),
    ({"rate_per_minute": -1.0}, InvalidBackfill, "more than 0 periods a minute"),
])
def test_bad_parameters_are_refused_by_name(
        options: dict[str, Any], error: type[Exception], message: str) -> None:
    """Unknown subjects, modes, limits and rates are errors before anything is planned."""
    values: dict[str, Any] = {"subjects": None, "reprocess": "none", "max_active": 2,
                              "rate_per_minute": None, **options}
    with pytest.raises(error, match=message):
        check(make(), "2026-01-01", "2026-01-02", values["subjects"], values["reprocess"],
              values["max_active"], values["rate_per_minute"], NOW)


@pytest.mark.parametrize(("text", "rate"), [("10/min", 10.0), ("0.5/min", 0.5), ("3", 3.0),
                                             (" 12 / min ", 12.0)])
def test_a_rate_is_periods_per_minute(text: str, rate: float) -> None:
    """--rate N/min, the unit optional."""
    assert parse_rate(text) == rate


@pytest.mark.parametrize("text", ["fast", "0/min", "10/s", "-1"])
def test_a_rate_that_is_not_a_positive_number_per_minute_is_refused(text: str) -> None:
    """The message shows the form expected."""
    with pytest.raises(InvalidBackfill, match="such as 10/min"):
        parse_rate(text)


@pytest.mark.parametrize(("reprocess", "run", "failed", "skipped", "requeue", "unskip"), [
    ("none", ["globex"], ["acme"], ["acme"], 0, 0),
    ("failed", ["acme", "globex"], [], ["acme"], 1, 0),
    ("skipped", ["acme", "globex"], ["acme"], [], 0, 1),
])
def test_reprocess_decides_whether_failed_runs_and_skipped_occurrences_run(
        reprocess: str, run: list[str], failed: list[str], skipped: list[str], requeue: int,
        unskip: int) -> None:
    """Day 1: acme completed, globex running (run again: run-job decides). Day 2: acme failed,
    globex pending. Day 3: acme skipped, globex never started. Completed never runs."""
    job = make()
    request = check(job, "2026-01-01", "2026-01-03", None, reprocess, 2, None, NOW)
    runs = {r.run_id: r for r in [run_state(job, "acme", "2026-01-01", "completed"),
                                  run_state(job, "globex", "2026-01-01", "running"),
                                  run_state(job, "acme", "2026-01-02", "failed"),
                                  run_state(job, "globex", "2026-01-02", "pending")]}
    skips = {o.run_id: o for o in [skip(job, "acme", "2026-01-03")]}
    one, two, three = plan(request, runs, skips).periods
    assert (one.run, one.completed) == (["globex"], ["acme"])
    assert (two.run, two.failed) == (run if reprocess == "failed" else ["globex"], failed)
    assert (three.run, three.skipped) == (run if reprocess == "skipped" else ["globex"], skipped)
    assert (len(two.requeue), len(three.unskip)) == (requeue, unskip)
    assert sum(len(p.run_ids) for p in (one, two, three)) == 6


def test_a_skip_of_an_occurrence_that_has_a_run_since_is_not_what_decides() -> None:
    """The Run is the fact: a completed one is completed, whatever skip was recorded."""
    job = make()
    request = check(job, "2026-01-01", "2026-01-01", ["acme"], "skipped", 2, None, NOW)
    completed = run_state(job, "acme", "2026-01-01", "completed")
    [period] = plan(request, {completed.run_id: completed},
                    {completed.run_id: skip(job, "acme", "2026-01-01")}).periods
    assert (period.run, period.completed, period.unskip) == ([], ["acme"], [])


def test_a_plan_summary_counts_what_runs_and_what_is_left() -> None:
    """One line: periods x subjects, to run, completed, failed, what is reprocessed first."""
    job = make()
    request = check(job, "2026-01-01", "2026-01-02", None, "failed", 2, None, NOW)
    failed = run_state(job, "acme", "2026-01-01", "failed")
    summary = plan(request, {failed.run_id: failed}, {}).summary()
    assert summary == ("backfill probe 2026-01-01..2026-01-02 (2 periods x 2 subjects): "
                       "4 to run, 1 failed requeued first")
