"""A tick's report: the flow run's final state, the artifact table, and the error classes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from prefect.states import Completed
from prefect.utilities.collections import visit_collection

from flows.errors import LeaseLapsed, is_transient
from flows.jobs import TransientError, ValidationFailed
from flows.model import CallCount, ModelRejected, ModelUnavailable
from flows.run_job.findings import lapsed_outcome
from flows.run_job.outcomes import SubjectOutcome, TickReport, outcome_name
from flows.run_job.stages import retried
from flows.run_job.tick import Persisted
from flows.spend import spend_of
from store import InvalidInput, Period, Run
from store.errors import LedgerBusy, LedgerError, LedgerUnavailable

PERIOD = Period(datetime(2026, 1, 5, tzinfo=UTC), datetime(2026, 1, 6, tzinfo=UTC), "UTC")


def report(*outcomes: str) -> TickReport:
    return TickReport("probe", "1", PERIOD, [
        SubjectOutcome(f"s{i}", f"{i:064d}", o, error="boom" if o == "failed" else None)  # type: ignore[arg-type]
        for i, o in enumerate(outcomes)
    ])


@pytest.mark.parametrize(("outcomes", "state"), [
    (("duplicate", "duplicate"), "Duplicate"),
    (("new", "duplicate"), "Completed"),
    (("new", "in-progress-elsewhere"), "InProgressElsewhere"),
    (("lease-lost", "in-progress-elsewhere"), "LeaseLost"),
    (("new", "failed", "lease-lost"), "Failed"),
    (("new", "stopped", "in-progress-elsewhere"), "Cancelled"),
    (("stopped", "failed"), "Failed"),
    (("new", "over-budget", "in-progress-elsewhere"), "OverBudget"),
    (("over-budget", "stopped"), "Cancelled"),
])
def test_the_flow_runs_final_state_summarises_its_subjects(outcomes: tuple[str, ...],
                                                             state: str) -> None:
    """Failed wins, then a stop, then over-budget; Duplicate only when every subject was a
    duplicate."""
    final = report(*outcomes).final_state()
    assert outcome_name(final) == state
    # A Completed state has one of Prefect's own names: the V1 UI's default filters hide any
    # other (a Duplicate is Cached). OverBudget is a Failed state of its own name.
    assert final.name == {"Duplicate": "Cached", "InProgressElsewhere": "Completed",
                          "LeaseLost": "Completed"}.get(state, state)
    assert final.is_failed() == (state in ("Failed", "OverBudget"))
    assert final.is_cancelled() == (state == "Cancelled")


def test_the_flow_runs_message_says_why_for_the_subjects_that_named_its_state() -> None:
    """Failed lists the failed subjects' errors; InProgressElsewhere who holds each Run."""
    held = SubjectOutcome("globex", "b" * 64, "in-progress-elsewhere",
                          error="leased by host:1:f/t until 2026-01-05T10:15:00+00:00")
    tick = TickReport("probe", "1", PERIOD, [SubjectOutcome("acme", "a" * 64, "new"), held])
    assert tick.final_state().message == (
        "InProgressElsewhere: probe/2026-01-05: 1 new, 1 in-progress-elsewhere "
        "(globex: leased by host:1:f/t until 2026-01-05T10:15:00+00:00)")
    assert report("new", "failed").final_state().message == (
        "probe/2026-01-05: 1 new, 1 failed (s1: boom)")
    assert report("new", "duplicate").final_state().message == "probe/2026-01-05: 1 new, 1 duplicate"


def test_the_summary_counts_each_outcome() -> None:
    """The summary reads like '2 new, 1 duplicate'."""
    assert report("new", "duplicate", "new").summary() == "probe/2026-01-05: 2 new, 1 duplicate"


def test_the_artifact_lists_every_subject_with_its_run_id_outcome_and_cost() -> None:
    """One Markdown table row per subject with its model calls, tokens and cost, and the tick's
    total; a pipe in an error cannot break the table; an unpriced call says "no price"."""
    priced = CallCount(made=1, reused=1, tokens=150, cost_nanos=450_000, records=[
        {"outcome": "answered", "prompt_tokens": 100, "completion_tokens": 50,
         "cost_nanos": 450_000, "currency": "USD"}])
    unpriced = CallCount(made=1, tokens=90, unpriced=1, records=[
        {"outcome": "answered", "prompt_tokens": 60, "completion_tokens": 30}])
    report = TickReport("probe", "1", PERIOD, [
        SubjectOutcome("acme", "a" * 64, "new", 1, 2, spend=priced, currency="USD"),
        SubjectOutcome("globex", "b" * 64, "failed", 1, 0, error="bad | input", spend=unpriced,
                       currency="USD"),
    ])
    text = report.markdown()
    assert f"| acme | `{'a' * 64}` | new | 1 | 2 | 1 (1) | 150 | 0.000450 USD |  |" in text
    assert "| 90 | no price | bad \\| input |" in text
    assert ("Model: 2 calls paid, 1 answers reused from a checkpoint, 240 tokens, 0.000450 USD "
            "+ 1 call with no price.") in text
    assert report.subjects[0].as_dict()["cost"] == "0.00045"


def test_the_artifact_counts_paid_calls_as_costs_does_a_refused_call_unpaid() -> None:
    """21 calls left, 20 answered and one refused with a 429: the artifact says 20 paid and 1
    refused, as ``costs`` (flows.spend) counts them; the subject's row and JSON agree."""
    answered = {"outcome": "answered", "prompt_tokens": 10, "completion_tokens": 5,
                "cost_nanos": 1_000, "currency": "USD"}
    records = [dict(answered) for _ in range(20)] + [{"outcome": "refused"}]
    spend = CallCount(made=21, tokens=300, cost_nanos=20_000, records=records)
    tick = TickReport("probe", "1", PERIOD, [
        SubjectOutcome("acme", "a" * 64, "new", 1, 1, spend=spend, currency="USD")])
    assert spend_of(records).paid == 20
    assert ("Model: 20 calls paid, 1 refused (not paid), 0 answers reused from a checkpoint, "
            "300 tokens, 0.000020 USD.") in tick.markdown()
    assert f"| acme | `{'a' * 64}` | new | 1 | 1 | 20 (0) | 300 |" in tick.markdown()
    fields = tick.subjects[0].as_dict()
    assert (fields["model_calls"], fields["calls_paid"], fields["calls_refused"]) == (21, 20, 1)


def test_an_over_budget_tick_is_a_failed_state_named_over_budget_with_a_short_message() -> None:
    """Counts, then one refusal (spent of which cap, the remedy), not one per subject: every
    subject's refusal is in the artifact."""
    refusal = ("over budget: the period budget from 2026-01-05T00:00:00+00:00 has spent 300 "
               "tokens of 300 tokens, no room for a call of about 150 tokens; raise the cap "
               "(the job's Budget(per_period=...)) and run `runledger reconcile probe` to "
               "finish it; the next period has a budget of its own")
    tick = TickReport("probe", "1", PERIOD, [SubjectOutcome("acme", "a" * 64, "new")] + [
        SubjectOutcome(f"s{i}", f"{i:064d}", "over-budget", error=refusal) for i in range(4)])
    state = tick.final_state()
    assert (state.type.value, state.name) == ("FAILED", "OverBudget")
    assert state.message == f"probe/2026-01-05: 1 new, 4 over-budget. O{refusal[1:]}"
    assert tick.markdown().count(refusal) == 4


def _run() -> Run:
    return Run.model_construct(run_id="a" * 64, status="completed", output={"text": "summary"},
                               raw_input={"text": "documents"})


@pytest.mark.parametrize("value", [
    report(*["new"] * 1000),
    Persisted(_run(), 1),
], ids=["the tick report", "a persisted run"])
def test_prefect_finds_nothing_to_walk_in_what_the_stages_and_the_flow_return(value: Any) -> None:
    """Prefect walks a task's or flow's return value looking for futures (every dataclass field,
    list, dict and pydantic field); these carry ledger rows and outputs, never futures, so each
    must be one leaf however many subjects it holds."""
    visited: list[Any] = []
    visit_collection(Completed(data=value), visit_fn=visited.append, return_data=False)
    assert any(v is value for v in visited)
    assert not any(isinstance(v, SubjectOutcome | Run | dict) for v in visited)


@pytest.mark.parametrize("error", [
    TransientError("x"), ModelUnavailable("x"), TimeoutError(), ConnectionResetError(),
    LedgerBusy(), LedgerUnavailable("the ledger database dropped the connection"),
])
def test_timeouts_rate_limits_and_lost_connections_are_transient(error: BaseException) -> None:
    """These are retried with backoff."""
    assert is_transient(error)


@pytest.mark.parametrize("error", [
    ValidationFailed("x"), ModelRejected("x"), InvalidInput("x"), KeyError("x"),
    LedgerError("the ledger schema is missing or out of date (no such table: runs)"),
])
def test_invalid_input_rejections_and_bugs_are_permanent(error: BaseException) -> None:
    """Retrying cannot fix these: the Run fails until an operator requeues it."""
    assert not is_transient(error)


def test_a_lapsed_lease_fails_the_subject_as_a_transient_error_named_by_its_type() -> None:
    """A lease not renewed for longer than it lasts is the unreachable ledger's doing: the
    subject is failed with the error's type first, as every failure, and a later attempt takes
    the Run over."""
    run = Run(run_id="9" * 64, job="probe", subject="acme", period_start=PERIOD.start,
              version="1", params_fingerprint="0" * 64, status="leased", attempts=1)
    lapsed = LeaseLapsed("run 999: lease of fence 1 lapsed: not renewed for 11 s (lease 10 s)")
    outcome = lapsed_outcome("acme", run, lapsed)
    assert (outcome.outcome, outcome.error) == ("failed", f"LeaseLapsed: {lapsed}")
    assert is_transient(lapsed)


def test_a_tick_read_is_retried_on_transient_errors_only() -> None:
    """``retried`` calls again after LedgerUnavailable (up to its retries) and raises a
    permanent LedgerError at once."""
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise LedgerUnavailable("restarting")
        return "read"

    assert retried(flaky, 2, 0.0) == "read" and len(calls) == 3
    calls.clear()
    with pytest.raises(LedgerUnavailable):
        retried(flaky, 1, 0.0)
    permanent: list[int] = []

    def broken() -> str:
        permanent.append(1)
        raise LedgerError("schema missing")

    with pytest.raises(LedgerError):
        retried(broken, 3, 0.0)
    assert len(permanent) == 1
