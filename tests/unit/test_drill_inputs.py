"""The drills' full-size inputs, checked at the size `make drills` runs them, without running
them: every period a full-size drill ticks is one the tick accepts today, through the tick's own
parse and due check. Issue 50: drill 1 spread its 1,000 Runs over 500 days from 2026-01-01, the
days after today were refused (PeriodNotDue), and the reduced form (25 days) never got there.

What only the full size reaches, and is checked here: drill 1's last 500 days and its spare days
(the ones a worker is given while kills are still owed, before the 500), its job's budget sized
for K = 100 kills, and drill 3's 100 days. Drill 5 and the host scenarios tick one fixed past
day at either size (and the ledger's today), checked too. The installed-package test ticks the
day three days before today, its job a scaffold's (not importable here); the fault points, the
commit cut and drill 4 tick nothing (they write Runs and messages through the ledger)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta

import pytest

from bench.volume_tick import volume_job
from flows.jobs import Job
from flows.jobs.competitor_summary import job as competitor_summary
from flows.jobs.schedule import require_due
from flows.run_job.flow import nominal_period
from store import RunledgerError
from tests.drills import test_batch_drill as batch_drill
from tests.drills import test_kill_drill as drill_1
from tests.drills import test_postgres_restart as drill_3
from tests.drills import test_volume_tick as drill_5
from tests.hosts import jobs as host_jobs
from tests.hosts import test_hosts as host_drills
from tests.support import batch_drill as batch_jobs
from tests.support.kill_drill import drill_job


def refused(job: Job, labels: Iterable[str], now: datetime) -> list[str]:
    """What a tick of ``job`` started at ``now`` with each of ``labels`` as its ``period``
    refuses to run (a period not due yet, or no period at all), as its error says it."""
    found = []
    for label in labels:
        try:
            require_due(job, nominal_period(job, label), now)
        except RunledgerError as error:
            found.append(str(error))
    return found


def full_size_ticks(now: datetime) -> dict[str, tuple[Job, list[str]]]:
    """Every full-size drill and host scenario that ticks periods it chose: its job and those
    periods (the host scenario that also ticks the ledger's today needs no check)."""
    days, spare = drill_1.drill_periods(True, now)
    batch_days, batch_spare = batch_drill.drill_periods(True, now)
    ticks = {"drill 1": (drill_job(drill_1.kills_of(True)), days + spare),
             "batch drill": (batch_jobs.drill_job(batch_drill.subjects_of(True)),
                             batch_days + batch_spare),
             "drill 3": (competitor_summary, drill_3.drill_periods(True, now)),
             # One fixed day each, in the past: due on any later date, checked all the same.
             "drill 5": (volume_job("volume-tick", 1), [drill_5.PERIOD])}
    for name, (_, delay) in host_drills.JOBS.items():
        ticks[f"host scenario job {name}"] = (host_jobs.job(name, 1, delay), [host_drills.PERIOD])
    return ticks


def test_every_period_a_full_size_drill_ticks_is_due_today() -> None:
    """At today's date, the tick accepts every period of every full-size drill."""
    now = datetime.now(UTC)
    for drill, (job, labels) in full_size_ticks(now).items():
        assert refused(job, labels, now) == [], drill


@pytest.mark.parametrize("now", [
    datetime(2026, 3, 29, 4, 59, tzinfo=UTC),  # Paris sprang forward: 06:59 CEST, 07:00 not reached
    datetime(2026, 10, 25, 6, 0, tzinfo=UTC),  # Paris falls back; 07:00 CET just reached
    datetime(2028, 2, 29, 23, 30, tzinfo=UTC),  # a leap day, already the 1st in Paris
    datetime(2031, 1, 1, 0, 0, tzinfo=UTC),
])
def test_full_size_periods_counted_back_are_due_whatever_the_date(now: datetime) -> None:
    """Counted back from ``now``, the full-size periods are due on any date, around a DST
    change or a day boundary included."""
    for drill, (job, labels) in full_size_ticks(now).items():
        assert refused(job, labels, now) == [], drill


def test_drill_1_at_full_size_ticks_500_distinct_days_and_keeps_its_spare_days_apart() -> None:
    """M/2 = 500 days, then 2K = 200 spare days before them, no day twice: a spare day ticked
    again would be a Duplicate, which passes no fault point."""
    days, spare = drill_1.drill_periods(True, datetime(2026, 12, 5, 12, tzinfo=UTC))
    assert (len(days), len(spare)) == (drill_1.runs_of(True) // 2, 2 * drill_1.kills_of(True))
    assert len(set(days) | set(spare)) == len(days) + len(spare)
    assert days[-1] == "2026-12-05" and spare[0] == (date.fromisoformat(days[0])
                                                     - timedelta(days=1)).isoformat()


def test_the_guard_refuses_days_counted_forward_from_a_fixed_start() -> None:
    """Drill 1's former days (500 from 2026-01-01), judged on 2026-12-05: every day after
    2026-12-05 is refused as not due, so the guard fails as the drill did."""
    start = date(2026, 1, 1)
    labels = [(start + timedelta(days=i)).isoformat() for i in range(500)]
    found = refused(competitor_summary, labels, datetime(2026, 12, 5, 12, tzinfo=UTC))
    assert len(found) == len(labels) - labels.index("2026-12-06")
    assert found[0].startswith("period 2026-12-06 of job competitor-summary is not due until "
                               "2026-12-06 07:00 CET")
