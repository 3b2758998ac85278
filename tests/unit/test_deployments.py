"""deployments/prefect.yaml and `runledger serve`: every shipped job is deployed on a schedule
that fires once per period, schedules keep their ids (slugs), and serve mirrors the file."""

from __future__ import annotations

import inspect
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from prefect.flows import Flow, load_flow_from_entrypoint

from deployments.project import (
    PREFECT_FILE,
    RUN_JOB,
    DeploymentSpec,
    InvalidDeployment,
    deployment,
    load_deployments,
)
from deployments.serve import runner_deployment
from flows.deployment_check import schedule_problems, with_every_job
from flows.jobs.schedule import derived_cron
from flows.registry import registered_jobs, shipped_jobs
from flows.stack.work_pool import DEFAULT_POOL

SPECS = load_deployments()
JOB_SPECS = [s for s in SPECS if s.entrypoint == RUN_JOB]


def test_every_shipped_job_has_exactly_one_deployment() -> None:
    """Each job shipped in flows/jobs is deployed once, by name, with nothing else pinned."""
    deployed = sorted(s.parameters["job"] for s in JOB_SPECS)
    assert deployed == sorted(job.name for job in shipped_jobs())
    assert all(s.name == s.parameters["job"] for s in JOB_SPECS)


@pytest.mark.parametrize("spec", JOB_SPECS, ids=lambda s: s.name)
def test_a_job_schedule_fires_once_per_period_in_the_jobs_timezone(spec: DeploymentSpec) -> None:
    """The cron runs in the job's own timezone, its consecutive slots fall in consecutive
    periods of the job's cadence, so no tick skips or repeats a period, and each slot is the
    job's due time for its period, so reconcile and the schedule agree on what is late."""
    job = registered_jobs()[spec.parameters["job"]]
    [schedule] = spec.schedules
    assert schedule.cron is not None and schedule.timezone == job.timezone
    start = datetime(2026, 3, 20, tzinfo=ZoneInfo(job.timezone))  # spans a DST change
    slots = croniter(schedule.cron, start)
    fired = [slots.get_next(datetime).astimezone(UTC) for _ in range(30)]
    periods = [job.period_at(slot) for slot in fired]
    assert all(a.end == b.start for a, b in pairwise(periods))
    assert [job.due_at(p) for p in periods] == fired
    assert schedule_problems([spec], start) == []
    assert schedule.cron == derived_cron(job)


def test_a_schedule_that_disagrees_with_its_job_is_named_with_the_cron_to_use() -> None:
    """A cron an hour off the job's due time, or in another timezone, is a problem that names
    the deployment, both times and the cron the Job derives."""
    [spec] = [s for s in JOB_SPECS if s.job == "competitor-summary"]
    start = datetime(2026, 3, 20, tzinfo=UTC)
    off = replace(spec, schedules=[replace(spec.schedules[0], cron="0 8 * * *")])
    [problem] = schedule_problems([off], start)
    assert problem.startswith("deployment competitor-summary: cron '0 8 * * *' fires at")
    assert "is due at 2026-03-20 07:00 CET; use cron '0 7 * * *'" in problem
    elsewhere = replace(spec, schedules=[replace(spec.schedules[0], timezone="UTC")])
    assert "runs in UTC but job competitor-summary counts periods in Europe/Paris" in \
        schedule_problems([elsewhere], start)[0]
    unknown = replace(spec, parameters={"job": "nope"})
    assert "unknown job 'nope'" in schedule_problems([unknown], start)[0]


def test_serve_without_a_file_adds_every_registered_job_on_its_derived_schedule() -> None:
    """Every registered job has a run-job deployment; one the file lacks gets the schedule
    derived from its Job, which the check accepts."""
    without_credit = [s for s in SPECS if s.job != "daily-credit"]
    specs = with_every_job(without_credit)
    [credit] = [s for s in specs if s.job == "daily-credit"]
    assert credit.entrypoint == RUN_JOB and credit.schedules[0].cron == "5 0 * * *"
    assert credit.schedules[0].timezone == "UTC"
    assert schedule_problems(specs, datetime(2026, 3, 20, tzinfo=UTC)) == []
    assert sorted(s.job for s in specs if s.job) == sorted(registered_jobs())


def test_every_schedule_has_a_unique_slug_and_a_timezone() -> None:
    """Slugs keep schedule ids (and Prefect's scheduled-run keys) stable across deploys."""
    slugs = [s.slug for spec in SPECS for s in spec.schedules]
    assert len(slugs) == len(set(slugs)) and all(slugs)
    assert all(s.timezone for spec in SPECS for s in spec.schedules)


def test_the_delivery_deployment_runs_on_an_anchored_interval_shorter_than_its_budget() -> None:
    """deliver-outbox runs every interval from a fixed anchor; one pass stops claiming before
    the next one is due."""
    spec = deployment("deliver-outbox")
    [schedule] = spec.schedules
    assert schedule.interval and schedule.anchor_date is not None
    assert schedule.anchor_date.tzinfo is not None
    assert spec.parameters["max_seconds"] < schedule.interval


def test_the_backfill_deployment_has_no_schedule_and_asks_for_job_start_and_end() -> None:
    """A person starts a backfill from the UI's Custom run: nothing scheduled, nothing pinned,
    and the flow's required parameters are exactly what they must give."""
    spec = deployment("backfill")
    assert spec.entrypoint == "flows.entrypoints.backfill" and spec.schedules == []
    assert spec.parameters == {} and set(spec.tags) == {"runledger", "backfill"}
    flow: Flow[..., Any] = load_flow_from_entrypoint(spec.entrypoint)
    required = [name for name, p in inspect.signature(flow.fn).parameters.items()
                if p.default is inspect.Parameter.empty]
    assert flow.name == "backfill" and required == ["job", "start", "end"]
    assert runner_deployment(spec).schedules == []


def test_the_revise_deployment_has_no_schedule_and_asks_for_the_run_and_a_reason() -> None:
    """A person revises a Run from the UI's Custom run: nothing scheduled, nothing pinned, the
    flow's required parameters are the Run's id and the reason, and its options are the CLI's."""
    spec = deployment("revise")
    assert spec.entrypoint == "flows.entrypoints.revise" and spec.schedules == []
    assert spec.parameters == {} and set(spec.tags) == {"runledger", "revise"}
    flow: Flow[..., Any] = load_flow_from_entrypoint(spec.entrypoint)
    parameters = inspect.signature(flow.fn).parameters
    required = [name for name, p in parameters.items() if p.default is inspect.Parameter.empty]
    assert flow.name == "revise" and required == ["run_id", "reason"]
    assert {n: p.default for n, p in parameters.items() if n not in required} == {
        "recollect": False, "resend": True, "params": None, "allow_not_due": False}
    assert runner_deployment(spec).schedules == []


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_deployment_parameters_are_parameters_of_its_flow(spec: DeploymentSpec) -> None:
    """Every entrypoint is a module path (it loads in any folder where runledger is installed),
    and every parameter exists on the flow."""
    assert spec.entrypoint.startswith("flows.entrypoints.") and ":" not in spec.entrypoint
    flow: Flow[..., Any] = load_flow_from_entrypoint(spec.entrypoint)
    assert set(spec.parameters) <= set(inspect.signature(flow.fn).parameters)
    assert spec.work_pool == DEFAULT_POOL and "runledger" in spec.tags


def test_the_pull_step_moves_flow_runs_to_the_checkout_that_deployed_them() -> None:
    """The build step records the deploying directory; the pull step goes there."""
    text = PREFECT_FILE.read_text()
    assert "id: project\n    script: pwd" in text
    assert 'directory: "{{ project.stdout }}"' in text


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_a_served_deployment_mirrors_prefect_yaml(spec: DeploymentSpec) -> None:
    """`runledger serve` registers the same name, parameters, tags and schedule slugs."""
    served = runner_deployment(spec)
    assert served.name == spec.name and served.parameters == spec.parameters
    assert set(served.tags) == set(spec.tags)
    assert [s.slug for s in served.schedules or []] == [s.slug for s in spec.schedules]
    assert served.work_pool_name is None


@pytest.mark.parametrize(("schedule", "message"), [
    ("{cron: '0 7 * * *', timezone: UTC}", "needs a slug"),
    ("{cron: '0 7 * * *', slug: s}", "needs a timezone"),
    ("{interval: 60, timezone: UTC, slug: s}", "needs an anchor_date"),
    ("{cron: '0 7 * * *', interval: 60, timezone: UTC, slug: s}", "exactly one of"),
])
def test_an_invalid_schedule_is_rejected_with_a_clear_error(
        tmp_path: Path, schedule: str, message: str) -> None:
    """A schedule that would drift or lose its id across deploys is refused by name."""
    path = tmp_path / "prefect.yaml"
    path.write_text(
        "deployments:\n- name: d\n  entrypoint: flows.entrypoints.run_job\n"
        f"  work_pool: {{name: runledger}}\n  schedules:\n  - {schedule}\n"
    )
    with pytest.raises(InvalidDeployment, match=message) as raised:
        load_deployments(path)
    assert "deployment 'd'" in str(raised.value)


def test_two_deployments_with_one_name_are_rejected(tmp_path: Path) -> None:
    """Deployment names are unique within the file."""
    one = "- name: d\n  entrypoint: a.py:f\n  work_pool: {name: p}\n"
    path = tmp_path / "prefect.yaml"
    path.write_text("deployments:\n" + one + one)
    with pytest.raises(InvalidDeployment, match="repeat"):
        load_deployments(path)


def test_the_prune_deployment_runs_daily_with_a_retention_every_setting_accepts() -> None:
    """prune runs once a day; its default retention parses and passes every refusal for
    every shipped job and the default delivery settings, so the scheduled pass never refuses."""
    from flows.delivery.settings import DeliverySettings
    from flows.retention import DEFAULT_OLDER_THAN, check_retention, parse_duration

    spec = deployment("prune")
    [schedule] = spec.schedules
    assert spec.entrypoint == "flows.entrypoints.prune" and schedule.cron is not None
    slots = croniter(schedule.cron, datetime(2026, 3, 20, tzinfo=UTC))
    first, second = slots.get_next(datetime), slots.get_next(datetime)
    assert second - first == timedelta(days=1)
    older_than = parse_duration(spec.parameters["older_than"])
    assert spec.parameters["older_than"] == DEFAULT_OLDER_THAN
    check_retention(older_than, shipped_jobs(), DeliverySettings(max_window_hours=12.0))
