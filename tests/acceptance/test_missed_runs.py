"""The missed-run drill on the acceptance stack's real `prefect server`: `runledger serve` runs two
every-minute jobs (policies ``catch-up`` and ``skip``) and their reconcile deployments; serving
stops for a few slots, which Prefect's scheduler then never creates; serving starts again. The
catch-up job completes each missed period once, the skip job records each one skipped, nothing
is sent twice, and (full size) the catch-up job's dead man's switch notifies a webhook while
nothing serves.

Reduced size (the suite): one missed slot. RUNLEDGER_FULL=1: three, and the dead man's switch."""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    DeploymentFilterName,
    FlowRunFilter,
    FlowRunFilterExpectedStartTime,
)
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.sorting import FlowRunSort
from prefect.settings import PREFECT_API_URL, temporary_settings

from deployments.project import PROJECT_ROOT
from flows.jobs import Job
from flows.registry import ENTRY_POINT_GROUP
from flows.stack import commands
from flows.stack.automations import DEAD_MANS_SWITCH, dead_mans_switch, install
from flows.stack.processes import Child
from store import Ledger, Period
from tests.support import drill_jobs
from tests.support.alerts import Webhook, removed_automations, webhook_block
from tests.support.ledger import model_calls
from tests.support.stack import AcceptanceStack
from tests.support.waiting import wait_until

# Bounds, not targets: on a loaded machine a served tick can take minutes to show.
pytestmark = [pytest.mark.postgres, pytest.mark.drill, pytest.mark.timeout(2400)]
PROGRESS_SECONDS = 480  # the most any one step may take before the test gives up

FULL = os.environ.get("RUNLEDGER_FULL") == "1"
MISSED_SLOTS = 3 if FULL else 1
JOBS = (drill_jobs.catch_up, drill_jobs.skip)
EVERY_SECONDS = 30  # reconcile and delivery while serving
# Serving stops at least this long before the next slot: `serve`'s runner takes a flow run up
# to 10 s before its start (its prefetch), and a slot whose run was taken has started, so a
# policy rightly re-drives its Runs instead of treating it as missed.
STOP_BEFORE_SLOT_SECONDS = 30
RUNNER_PREFETCH = timedelta(seconds=10)


def drill_deployments() -> dict[str, Any]:
    """The drill's prefect.yaml: each job on its cadence, a reconcile and a delivery pass."""
    anchor = "2026-01-01T00:00:00+00:00"

    def interval(slug: str) -> list[dict[str, Any]]:
        return [{"interval": EVERY_SECONDS, "anchor_date": anchor, "timezone": "UTC",
                 "slug": slug}]

    pool = {"name": "unused-by-serve"}
    deployments: list[dict[str, Any]] = []
    for job in JOBS:
        deployments += [
            {"name": job.name, "entrypoint": "flows.entrypoints.run_job",
             "parameters": {"job": job.name}, "work_pool": pool,
             "schedules": [{"cron": job.cadence, "timezone": job.timezone,
                            "slug": f"{job.name}-every-minute"}]},
            {"name": f"reconcile-{job.name}", "entrypoint": "flows.entrypoints.reconcile",
             "parameters": {"job": job.name}, "work_pool": pool,
             "schedules": interval(f"reconcile-{job.name}")},
        ]
    deployments.append(
        {"name": "deliver-drill", "entrypoint": "flows.entrypoints.deliver_outbox",
         "parameters": {"batch_size": 100, "max_seconds": 10}, "work_pool": pool,
         "schedules": interval("deliver-drill")})
    return {"name": "runledger-drill", "deployments": deployments}


def published_jobs(folder: Path) -> Path:
    """A distribution's metadata publishing drill_jobs under the runledger.jobs entry point;
    the folder to put on PYTHONPATH."""
    info = folder / "runledger_drill_jobs-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: runledger-drill-jobs\n"
                                   "Version: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\ndrill = {drill_jobs.__name__}\n")
    return folder


class Drill:
    """The drill's own ledger, model call log and serve processes on the stack's server."""

    def __init__(self, stack: AcceptanceStack, ledger_url: str, folder: Path) -> None:
        self.stack = stack
        self.ledger_url = ledger_url
        self.file = folder / "prefect.yaml"
        self.file.write_text(yaml.safe_dump(drill_deployments(), sort_keys=False))
        self.env = {
            **stack.worker_env,
            "PREFECT_HOME": str(folder / "prefect"),
            "PREFECT_RUNNER_POLL_FREQUENCY": "2",
            "PYTHONPATH": os.pathsep.join([str(published_jobs(folder / "dist")),
                                           str(PROJECT_ROOT)]),
            "RUNLEDGER_DATABASE_URL": ledger_url,
            "RUNLEDGER_OFFLINE_MODEL_DELAY_SECONDS": "0",
            "RUNLEDGER_RECONCILE_BACKOFF_SECONDS": "5",
            "COLUMNS": "160",
        }
        self.serving: Child | None = None
        self.starts = 0

    def runledger(self, *args: str) -> str:
        done = subprocess.run(commands.runledger_argv(*args), env=self.env, cwd=PROJECT_ROOT,
                              capture_output=True, text=True, timeout=PROGRESS_SECONDS)
        assert done.returncode in (0, 1), done.stdout + done.stderr  # 1: something overdue
        return done.stdout

    def overdue(self) -> str:
        return "".join(self.runledger("overdue", "--job", job.name) for job in JOBS)

    def serve(self) -> None:
        self.starts += 1
        self.serving = self.stack.supervisor.start(
            f"serve-drill-{self.starts}",
            commands.runledger_argv("serve", "--file", str(self.file)), self.env,
            cwd=PROJECT_ROOT)

    def stop_serving(self) -> None:
        assert self.serving is not None
        self.stack.supervisor.terminate(self.serving, grace_seconds=30)
        assert self.serving.process.returncode is not None
        self.serving = None

    def ledger(self) -> Ledger:
        return Ledger.connect(self.ledger_url)

    def completed_runs(self, job: Job) -> set[tuple[str, datetime]]:
        """The (subject, period start) of each of the job's completed Runs."""
        with self.ledger() as ledger:
            return {(r.subject, r.period_start) for r in ledger.runs(job=job.name, limit=10_000)
                    if r.status == "completed"}

    def completed(self, job: Job) -> Counter[datetime]:
        """How many subjects completed, by period start."""
        return Counter(start for _, start in self.completed_runs(job))

    def skipped(self, job: Job) -> set[tuple[str, datetime]]:
        with self.ledger() as ledger:
            return {(o.subject, o.period_start)
                    for o in ledger.occurrences.list(job.name, datetime(2000, 1, 1, tzinfo=UTC))
                    if o.skipped_at is not None}

    def model_calls(self) -> Counter[str]:
        with self.ledger() as ledger:
            return Counter(str(c["run_id"]) for c in model_calls(ledger))

    def progress(self) -> str:
        """What a stuck wait reports: each job's completed and skipped periods, the drill's flow
        runs by deployment and state (a served tick that waits shows Late), and `serve`'s log."""
        lines = []
        for job in JOBS:
            done = {f"{start:%H:%M}": n for start, n in sorted(self.completed(job).items())}
            skipped = {f"{start:%H:%M}" for _, start in self.skipped(job)}
            lines.append(f"{job.name}: completed {done}, skipped {sorted(skipped)}")
        states = Counter(f"{deployment} {run.state_name}" for deployment, run in self.runs())
        lines.append(f"flow runs: {dict(sorted(states.items()))}")
        if self.serving is not None:
            running = "running" if self.serving.running() else "exited"
            lines.append(f"serve ({running}), its log's end:\n{self.serving.log_tail(15)}")
        return "\n".join(lines)

    def runs(self) -> list[tuple[str, FlowRun]]:
        """The latest 200 flow runs of the drill's deployments due by now (not the scheduler's
        runs for future slots), each with its deployment's name, oldest first."""
        names = [str(d["name"]) for d in drill_deployments()["deployments"]]
        with self.stack.client() as api:
            deployments = {d.id: d.name for d in api.read_deployments(
                deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=names)))}
            runs = api.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=list(deployments))),
                flow_run_filter=FlowRunFilter(expected_start_time=FlowRunFilterExpectedStartTime(
                    before_=datetime.now(UTC))),
                sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=200)
        return [(deployments[run.deployment_id], run) for run in reversed(runs)
                if run.deployment_id in deployments]

    def flow_runs(self) -> list[str]:
        """What the UI's runs page shows for the drill's deployments: deployment, state, message."""
        return [f"{deployment:24} {run.state.name:12} {(run.state.message or '')[:90]}"
                for deployment, run in self.runs()
                if run.state is not None and run.state.is_final()]


@pytest.fixture
def drill(stack: AcceptanceStack, postgres_databases, tmp_path: Path  # type: ignore[no-untyped-def]
          ) -> Iterator[Drill]:
    ledger_url = postgres_databases.create()
    drill = Drill(stack, ledger_url, tmp_path)
    try:
        yield drill
    finally:
        if drill.serving is not None:
            drill.stop_serving()
        postgres_databases.drop(ledger_url)


def every_subject(counts: Counter[datetime]) -> set[datetime]:
    return {start for start, n in counts.items() if n == len(drill_jobs.SUBJECTS)}


def slots_between(job: Job, after: datetime, before: datetime) -> list[Period]:
    """The job's periods whose slot (its due time) fell strictly between the two instants."""
    periods, period = [], job.period_at(after)
    while job.due_at(period) < before:
        if job.due_at(period) > after:
            periods.append(period)
        period = job.period_at(period.end)
    return periods


def seconds_to_next_slot(job: Job, now: datetime) -> float:
    """How long until the next due time of ``job`` after ``now``."""
    period = job.period_at(now)
    while job.due_at(period) <= now:
        period = job.period_at(period.end)
    return (job.due_at(period) - now).total_seconds()


def test_missed_slots_are_caught_up_or_skipped_once_after_serving_resumes(drill: Drill) -> None:
    """Serve, stop for MISSED_SLOTS slots, serve again: the catch-up job completes each missed
    period once (one model call per Run), the skip job records each one skipped and runs
    nothing for it, every email arrives once, and (full size) the dead man's switch notified
    while nothing served."""
    drill.runledger("db", "upgrade")
    drill.serve()

    def first_ticks() -> set[datetime] | None:
        """The periods each job completed, once each job completed one (not necessarily the
        same period: each job's tick is a flow run of its own, started when the runner can)."""
        ticks = [every_subject(drill.completed(job)) for job in JOBS]
        return set().union(*ticks) if all(ticks) else None

    ticked = wait_until(first_ticks, PROGRESS_SECONDS, "a first completed tick of each job",
                        state=drill.progress)
    print(f"\nafter the first ticks:\n{drill.progress()}")

    switch = DEAD_MANS_SWITCH.format(job=drill_jobs.catch_up.name)
    with Webhook() as webhook, temporary_settings({PREFECT_API_URL: drill.stack.api}), \
            webhook_block(drill.stack.api, webhook, "/drill") as (_, block_id), \
            removed_automations(drill.stack.api, switch):
        if FULL:
            with drill.stack.client() as api:
                install(api, dead_mans_switch(drill_jobs.catch_up, block_id, datetime.now(UTC)))
        wait_until(lambda: seconds_to_next_slot(drill_jobs.catch_up, datetime.now(UTC))
                   >= STOP_BEFORE_SLOT_SECONDS, 120, "a moment well before the next slot")
        drill.stop_serving()
        # A slot due within the prefetch of the stop may have been taken: not counted missed.
        stopped = datetime.now(UTC)
        missable_after = stopped + RUNNER_PREFETCH
        last = max(ticked)
        print(f"\nstopped serving at {stopped:%H:%M:%S}; last tick {last:%H:%M}")
        # Until MISSED_SLOTS slots passed with nothing serving (and, full size, the switch).
        wait_until(lambda: len(slots_between(drill_jobs.catch_up, missable_after,
                                             datetime.now(UTC))) >= MISSED_SLOTS,
                   120 * MISSED_SLOTS, f"{MISSED_SLOTS} slots to pass")
        if FULL:
            [alert] = wait_until(lambda: webhook.received("/drill")[:1], 300,
                                 "the dead man's switch to notify")
            print(f"dead man's switch at {datetime.now(UTC):%H:%M:%S}: {alert.subject}")
        print("runledger overdue during the outage:")
        print(drill.overdue())
        restarted = datetime.now(UTC)
        drill.serve()
        if FULL:
            assert all(n.subject == alert.subject for n in webhook.received("/drill"))

    missed = {job.name: slots_between(job, missable_after, restarted) for job in JOBS}
    print(f"served again at {restarted:%H:%M:%S}; missed slots: "
          f"{[p.label for p in missed[drill_jobs.catch_up.name]]}")
    assert len(missed[drill_jobs.catch_up.name]) >= MISSED_SLOTS

    catch_up_missed = {p.start for p in missed[drill_jobs.catch_up.name]}
    wait_until(lambda: catch_up_missed <= every_subject(drill.completed(drill_jobs.catch_up)),
               PROGRESS_SECONDS, "the catch-up job to complete every missed period")
    skip_missed = {(s, p.start) for p in missed[drill_jobs.skip.name]
                   for s in drill_jobs.SUBJECTS}
    wait_until(lambda: skip_missed <= drill.skipped(drill_jobs.skip), PROGRESS_SECONDS,
               "the skip job to record every missed period skipped")
    assert not {start for _, start in skip_missed} & set(drill.completed(drill_jobs.skip))

    # A tick under way when serving stopped left its Runs pending: reconcile re-drives them.
    through = max(p.start for p in missed[drill_jobs.catch_up.name])

    def unfinished() -> dict[str, str]:
        """Each Run of a period through the last missed one that has not completed: its status."""
        with drill.ledger() as ledger:
            return {f"{r.job} {r.subject} {r.period_start:%H:%M}": r.status
                    for r in ledger.runs(limit=10_000)
                    if r.period_start <= through and r.status != "completed"}

    wait_until(lambda: not unfinished(), PROGRESS_SECONDS,
               "every Run through the last missed period completed", state=unfinished)

    def owed() -> set[tuple[str, str]]:
        """The email of every completed Run (recipient, subject). Each Run completes on its
        own: while serving, a tick may have completed one subject and not yet the other."""
        return {(drill_jobs.recipient(job.name, subject),
                 f"{job.name} {subject} {job.period_at(start).label}")
                for job in JOBS for subject, start in drill.completed_runs(job)}

    def sent() -> Counter[tuple[str, str]]:
        return Counter((str(m["To"]), str(m["Subject"])) for m in drill.stack.mail()
                       if str(m["To"]).endswith(drill_jobs.DOMAIN))

    # Every completed Run's email, once each, after a delivery pass has run.
    expected = owed()
    wait_until(lambda: expected <= set(sent()), PROGRESS_SECONDS, "every completed Run's email")
    drill.stop_serving()
    # Read again once nothing serves: a tick that completed meanwhile may have sent its email.
    expected, got = owed(), sent()
    assert {k: n for k, n in got.items() if n > 1} == {}, "an email was sent twice"
    assert set(got) - expected == set()
    calls = drill.model_calls()
    assert calls and max(calls.values()) == 1, f"a Run called the model twice: {calls}"
    with drill.ledger() as ledger:
        runs = ledger.runs(limit=10_000)
    # Serving stopped at an arbitrary moment: a later tick under way then may be left pending.
    assert {r.status for r in runs if r.period_start <= through} == {"completed"}
    assert {r.run_id for r in runs if r.status == "completed"} <= set(calls)

    print("runledger overdue after recovery:")
    print(drill.overdue())
    print("the drill's flow runs, as the Prefect UI lists them:")
    print("\n".join(drill.flow_runs()))
    print(json.dumps({"missed": {k: [p.label for p in v] for k, v in missed.items()},
                      "emails": sum(got.values()), "runs": len(runs)}, indent=1))
