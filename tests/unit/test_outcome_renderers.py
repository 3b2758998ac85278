"""Every subject outcome through every place that shows one: the `runledger run` table and its
JSON, the backfill table, progress bar and state, the tick's artifact, its event, its flow run
state and a revision's; so that a new outcome cannot crash a command after its tick ran."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from typing import get_args

import pytest
from rich.console import Console

from flows.backfill.plan import PeriodPlan, Plan
from flows.backfill.report import COUNTED, BackfillReport, PeriodResult
from flows.backfill.request import Request
from flows.cli import backfill_commands, run_commands
from flows.jobs import Candidate, Job
from flows.model import CallCount
from flows.run_job.outcomes import (
    EVENTS,
    OUTCOMES,
    STATE_NAMES,
    Outcome,
    SubjectOutcome,
    TickReport,
    outcome_name,
)
from flows.run_job.revision import REVISION_STATE_NAMES, RevisionReport
from store import Period, Run

PERIOD = Period(datetime(2026, 1, 5, tzinfo=UTC), datetime(2026, 1, 6, tzinfo=UTC), "UTC")
ANSWERED = {"outcome": "answered", "prompt_tokens": 10, "completion_tokens": 5,
            "cost_nanos": 1_000, "currency": "USD"}
JOB = Job(name="probe", version="1", cadence="daily", timezone="UTC", subjects=["acme"],
          collect=lambda s, p: {}, transform=lambda r, m: Candidate("x", "m"),
          validate=lambda c: None, messages=lambda s, p, o: [])


def tick(outcome: Outcome) -> TickReport:
    """A tick whose one subject ended ``outcome``, with a call paid and an error to show."""
    spend = CallCount(made=1, tokens=15, cost_nanos=1_000, records=[dict(ANSWERED)])
    return TickReport("probe", "1", PERIOD, [SubjectOutcome(
        "acme", "a" * 64, outcome, 1, error=f"why it ended {outcome}", spend=spend,
        currency="USD")])


def printed(width: int = 200) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=width, color_system=None), out


def test_the_outcome_literal_and_its_tuple_list_the_same_outcomes() -> None:
    """OUTCOMES, which the renderers below walk, is every value of the Outcome literal."""
    assert sorted(OUTCOMES) == sorted(get_args(Outcome))


@pytest.mark.parametrize("outcome", OUTCOMES)
def test_runledger_run_prints_every_outcome_as_a_table_and_as_json(
        outcome: Outcome, monkeypatch: pytest.MonkeyPatch) -> None:
    """The table row names the outcome in its own style; the JSON says it and the state."""
    console, out = printed()
    monkeypatch.setattr(run_commands, "console", lambda stderr=False: console)
    report = tick(outcome)
    run_commands._print(report)
    assert outcome in out.getvalue() and "acme" in out.getvalue()
    assert run_commands.STYLES[outcome]
    shown = json.loads(json.dumps(report.as_dict()))
    assert shown["subjects"][0]["outcome"] == outcome
    assert shown["state"] == STATE_NAMES[outcome]


@pytest.mark.parametrize("outcome", OUTCOMES)
def test_the_tick_artifact_event_and_flow_run_state_name_every_outcome(outcome: Outcome) -> None:
    """The artifact has the subject's row; the event and the state's outcome name exist."""
    report = tick(outcome)
    assert f"| acme | `{'a' * 64}` | {outcome} |" in report.markdown()
    assert EVENTS[outcome].startswith("runledger.run.")
    state = report.final_state()
    assert outcome_name(state) == STATE_NAMES[outcome]
    assert state.is_completed() == (outcome not in ("failed", "stopped", "over-budget",
                                                    "waiting"))
    assert state.is_paused() == (outcome == "waiting")


@pytest.mark.parametrize("outcome", OUTCOMES)
def test_a_backfill_counts_prints_and_states_every_outcome(outcome: Outcome) -> None:
    """A backfill's summary counts it, its table and progress bar print it, its state is
    Failed for a failure, OverBudget for over-budget, else Completed."""
    assert outcome in COUNTED
    request = Request(JOB, [PERIOD], ["acme"])
    planned = PeriodPlan(PERIOD, ["acme"], [], [], [], {"acme": "a" * 64})
    report = BackfillReport(Plan(request, [planned]),
                            [PeriodResult(planned, tick(outcome), "f" * 36)])
    assert f"1 {outcome}" in report.summary()
    console, out = printed()
    backfill_commands._print_report(console, report)
    bar = backfill_commands._ProgressBar(console, 1)
    bar.advance(report.results[0])
    assert f"1 {outcome}" in out.getvalue() + bar._description()
    state = report.final_state()
    assert (state.name, state.type.value) == {
        "failed": ("Failed", "FAILED"), "over-budget": ("OverBudget", "FAILED")}.get(
        outcome, ("Completed", "COMPLETED"))


@pytest.mark.parametrize("outcome", OUTCOMES)
def test_a_revision_states_every_outcome_its_subject_can_end_in(outcome: Outcome) -> None:
    """A revise flow run's state for any outcome: no outcome is missing from its names."""
    run = Run.model_construct(run_id="a" * 64, revision=1, status="pending")
    state = RevisionReport(run, outcome, f"revision {outcome}").final_state()
    assert outcome_name(state) == REVISION_STATE_NAMES[outcome]
