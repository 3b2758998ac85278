"""Finding jobs by name: the package's own modules and the ``runledger.jobs`` entry points."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from flows.errors import InvalidJob, UnknownJob
from flows.jobs import daily_credit
from flows.registry import (
    ENTRY_POINT_GROUP,
    get_job,
    jobs_from_entry_points,
    register,
    registered_jobs,
)


def test_both_reference_jobs_are_found_by_name() -> None:
    """competitor-summary and daily-credit are defined in flows/jobs and need no registration."""
    assert {"competitor-summary", "daily-credit"} <= set(registered_jobs())
    assert get_job("daily-credit") is daily_credit.job


def test_an_unknown_job_is_an_error_that_lists_the_registered_jobs() -> None:
    """The error names the wrong job and the ones that exist."""
    with pytest.raises(UnknownJob, match=r"unknown job 'nope'; registered jobs: .*competitor-summary"):
        get_job("nope")


def test_another_job_under_a_taken_name_is_refused() -> None:
    """Two different jobs cannot share a name; registering the same job again is harmless."""
    from dataclasses import replace

    assert register(daily_credit.job) is daily_credit.job
    with pytest.raises(InvalidJob, match="two different jobs are named 'daily-credit'"):
        register(replace(daily_credit.job, version="2"))


def test_an_entry_point_may_publish_a_job_or_a_module_of_jobs() -> None:
    """The value of a ``runledger.jobs`` entry point is a Job or a module defining Jobs."""
    found = jobs_from_entry_points([
        EntryPoint("credit", "flows.jobs.daily_credit:job", ENTRY_POINT_GROUP),
        EntryPoint("summary", "flows.jobs.competitor_summary", ENTRY_POINT_GROUP),
    ])
    assert [j.name for j in found] == ["daily-credit", "competitor-summary"]


def test_a_broken_entry_point_is_a_clear_error() -> None:
    """An entry point that cannot load, or is not a job, names itself in the error."""
    with pytest.raises(InvalidJob, match=r"entry point broken = 'flows\.jobs\.missing:job'"):
        jobs_from_entry_points([EntryPoint("broken", "flows.jobs.missing:job", ENTRY_POINT_GROUP)])
    with pytest.raises(InvalidJob, match="is a str, not a Job"):
        jobs_from_entry_points([EntryPoint("odd", "flows.registry:PACKAGE", ENTRY_POINT_GROUP)])


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("false", False)])
def test_runledger_example_jobs_decides_whether_the_examples_are_registered(
        monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    """The setting wins over the default (examples in a checkout, none in a wheel install)."""
    from flows.registry import examples_registered

    monkeypatch.setenv("RUNLEDGER_EXAMPLE_JOBS", value)
    assert examples_registered() is expected


def test_a_checkout_registers_the_examples_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """This suite runs from an editable install of the checkout: the examples are there."""
    from flows.registry import examples_registered

    monkeypatch.delenv("RUNLEDGER_EXAMPLE_JOBS", raising=False)
    assert examples_registered() is True
