"""The run-job flow as the Prefect UI shows it: its name, its parameters' descriptions, and a
deployment's parameter schema."""

from __future__ import annotations

from deployments.project import load_deployments
from deployments.serve import runner_deployment
from flows.run_job.flow import run_job


def test_the_flow_is_called_run_job() -> None:
    """Deployments and automations refer to the flow by this name."""
    assert run_job.name == "run-job"


def test_every_parameter_has_a_description_for_the_custom_run_form() -> None:
    """The Custom run form shows each parameter's description from the docstring."""
    properties = run_job.parameters.properties
    assert set(properties) == {"job", "subjects", "period", "allow_not_due", "shard_size",
                               "batch"}
    assert all(properties[name].get("description") for name in properties)


def test_a_deployment_of_the_flow_shows_only_what_a_person_sets() -> None:
    """The deployment's parameter schema (the Custom run form) has no internal shard field: a
    sharded tick tells its shards which they are through their idempotency keys."""
    [spec] = [s for s in load_deployments() if s.job == "competitor-summary"]
    properties = runner_deployment(spec)._parameter_openapi_schema.properties
    assert set(properties) == {"job", "subjects", "period", "allow_not_due", "shard_size",
                               "batch"}


def test_the_period_description_explains_both_formats_and_the_default() -> None:
    """A person can tell how to fill `period`: a date, an ISO datetime with offset, or empty."""
    description = run_job.parameters.properties["period"]["description"]
    assert "YYYY-MM-DD" in description
    assert "offset" in description
    assert "empty" in description.lower()
