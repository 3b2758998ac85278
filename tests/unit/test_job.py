"""The Job definition API: validation, periods in the job's timezone, subjects, missed runs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from flows.errors import InvalidJob, UnknownSubject
from flows.jobs import Candidate, Job, Target
from store import InvalidInput, OutboxMessage, Period
from store.errors import InvalidPeriod


def _collect(subject: str, period: Period) -> dict[str, Any]:
    return {"subject": subject}


def _transform(raw: dict[str, Any], model: Any) -> Candidate:
    return Candidate("text", "none")


def _validate(candidate: Candidate) -> None:
    return None


def _messages(subject: str, period: Period, output: dict[str, Any]) -> list[OutboxMessage]:
    return []


def make(**overrides: Any) -> Job:
    values: dict[str, Any] = {
        "name": "probe", "version": "1", "cadence": "daily", "timezone": "Europe/Paris",
        "subjects": ["acme", "globex"], "collect": _collect, "transform": _transform,
        "validate": _validate, "messages": _messages,
    }
    values.update(overrides)
    return Job(**values)


@pytest.mark.parametrize("name", ["Probe", "probe job", "probe--job", "-probe", "probe_job", ""])
def test_a_job_name_must_be_lowercase_words_joined_by_dashes(name: str) -> None:
    """Names end up in artifact keys and tags, so only lowercase words and dashes are allowed."""
    with pytest.raises(InvalidJob, match="lowercase"):
        make(name=name)


def test_a_job_with_an_unknown_timezone_is_refused() -> None:
    """An unknown IANA zone is an error, never silently UTC."""
    with pytest.raises(InvalidPeriod, match="Mars/Olympus"):
        make(timezone="Mars/Olympus")


def test_a_job_with_an_invalid_cadence_is_refused() -> None:
    """The cadence must be named or a 5-field cron expression."""
    with pytest.raises(InvalidPeriod, match="cadence"):
        make(cadence="every tuesday")


def test_a_job_with_an_unknown_missed_run_policy_is_refused() -> None:
    """The missed-run policy is one of skip, latest, catch-up."""
    with pytest.raises(InvalidJob, match="missed_runs"):
        make(missed_runs="sometimes")


@pytest.mark.parametrize("name", ["", "  ", "x" * 301, 7])
def test_a_job_needs_an_endpoint_name(name: object) -> None:
    """An empty, overlong or non-text endpoint name is an InvalidJob."""
    with pytest.raises(InvalidJob, match="endpoint must name"):
        make(endpoint=name)


@pytest.mark.parametrize("targets", ["email", ["email"], [None]])
def test_a_jobs_targets_must_be_targets(targets: object) -> None:
    """A string, or a list holding something other than Targets, is an InvalidJob naming the
    form it takes."""
    with pytest.raises(InvalidJob, match=r"targets must be Targets, such as \[Target.email\(\)"):
        make(targets=targets)


def test_a_jobs_targets_default_to_email_and_lose_repeats() -> None:
    """No targets: email only; the same target twice is listed once, in order."""
    assert make().target_list() == [Target.email()]
    hook = Target.webhook("reports-api")
    assert make(targets=[hook, Target.email(), hook]).target_list() == [hook, Target.email()]


def test_a_target_names_its_block_as_a_block_name() -> None:
    """A webhook or object target's block is a Prefect block name, or an InvalidInput."""
    with pytest.raises(InvalidInput, match="webhook target's endpoint block"):
        Target.webhook("Reports API")


def test_a_job_needs_callable_stages() -> None:
    """Each stage must be a function."""
    with pytest.raises(InvalidJob, match="collect must be a function"):
        make(collect="not a function")


def test_the_period_is_the_day_in_the_jobs_timezone() -> None:
    """23:30 UTC on 4 January is already 5 January in Paris."""
    period = make().period_at(datetime(2026, 1, 4, 23, 30, tzinfo=UTC))
    assert period.label == "2026-01-05"
    assert period.start == datetime(2026, 1, 4, 23, tzinfo=UTC)


def test_a_period_date_names_the_day_in_the_jobs_timezone() -> None:
    """``2026-07-01`` is the Paris day, which starts at 22:00 UTC the day before in summer."""
    period = make().parse_period("2026-07-01")
    assert period.start == datetime(2026, 6, 30, 22, tzinfo=UTC)


def test_a_naive_period_datetime_is_refused_with_a_hint() -> None:
    """A datetime without an offset has no instant: the error says how to write one."""
    with pytest.raises(InvalidPeriod, match="naive datetime"):
        make().parse_period("2026-01-05T09:00:00")


def test_all_subjects_are_run_when_none_are_requested() -> None:
    """No requested subjects means every subject of the job, in order, without repeats."""
    job = make(subjects=lambda: ["b", "a", "b"])
    assert job.resolve_subjects(None) == ["b", "a"]
    assert job.resolve_subjects([]) == ["b", "a"]


def test_requested_subjects_are_deduplicated_and_checked() -> None:
    """Requested subjects keep their order; an unknown one names the known ones."""
    job = make()
    assert job.resolve_subjects(["globex", "acme", "globex"]) == ["globex", "acme"]
    with pytest.raises(UnknownSubject, match=r"'initech'.*known subjects: acme, globex"):
        job.resolve_subjects(["acme", "initech"])


def test_a_candidates_output_holds_its_data_text_and_model() -> None:
    """The stored output is the candidate's data plus its text and model name."""
    output = Candidate("summary", "m1", {"workspace": "acme"}).output()
    assert output == {"workspace": "acme", "text": "summary", "model": "m1"}


def test_run_params_default_to_none() -> None:
    """A job without params registers its Runs with empty params."""
    job = make()
    assert job.run_params("acme", job.parse_period("2026-01-05")) == {}
