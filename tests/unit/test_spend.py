"""Model calls added up: invariant 11 judged per Run from its call records (a killed worker's
call without an outcome cannot break it), and a completed Run's spend over every attempt in
what its outcome reports."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from flows.model import CallCount
from flows.run_job.outcomes import SubjectOutcome
from flows.spend import spend_of


def call(outcome: str | None, tokens: int | None = None, cost: int | None = None,
         reuses: int = 0) -> dict[str, Any]:
    """A model call record as the ledger reads it."""
    return {"outcome": outcome, "prompt_tokens": tokens, "completion_tokens": 0 if tokens else None,
            "cost_nanos": cost, "currency": "EUR" if cost is not None else None,
            "reuses": reuses, "started_at": datetime(2026, 12, 3, tzinfo=UTC)}


@pytest.mark.parametrize(("outcomes", "kept"), [
    ((None, "answered"), True),  # killed in flight, never marked lost: the next call is owed
    ((None, None, "answered"), True),
    (("lost", "answered"), True),
    (("failed", "answered"), True),
    (("refused", "answered"), True),  # refused: not billed
    (("answered",), True),
    ((None,), True),
    (("answered", "answered"), False),  # an answer paid twice
    (("lost", "answered", "answered"), False),
    ((None, "answered", "answered"), False),
])
def test_a_runs_calls_keep_invariant_11_when_every_call_past_one_follows_a_call_never_answered(
        outcomes: tuple[str | None, ...], kept: bool) -> None:
    """Paid <= 1 + never answered, per Run: a call still without an outcome after its worker
    died counts as the lost call it is (both sides), never as a paid call that was answered."""
    spend = spend_of([call(o, 100 if o == "answered" else None) for o in outcomes])
    assert spend.keeps_invariant() is kept
    assert spend.unanswered == sum(o in (None, "lost", "failed") for o in outcomes)


def test_a_completed_runs_outcome_reports_this_attempts_calls_and_the_runs_over_every_attempt(
        ) -> None:
    """The attempt's fields stay its own (1 call, 150 tokens); ``run_spend`` adds the Run's:
    2 paid, 1 of them lost, the answered one's tokens and cost, 1 of unknown cost."""
    run = spend_of([call("lost"), call("answered", 150, 36_000)])
    outcome = SubjectOutcome("acme", "a" * 64, "new", 2, 1, currency="EUR", run_spend=run,
                             spend=CallCount(made=1, tokens=150, cost_nanos=36_000))
    shown = outcome.as_dict()
    assert (shown["model_calls"], shown["tokens"], shown["cost"]) == (1, 150, "0.000036")
    assert shown["run_spend"] == {
        "calls_paid": 2, "calls_lost": 1, "calls_failed": 0, "calls_refused": 0,
        "calls_in_flight": 0, "calls_queued": 0, "calls_batched": 0, "batch_saved": {},
        "calls_reused": 0, "tokens": 150, "cached_tokens": 0,
        "cache_write_tokens": 0, "cost": {"EUR": "0.000036"},
        "calls_without_price": 0, "calls_of_unknown_cost": 1, "calls_over_bound": 0,
        "tokens_over_bound": 0}
    assert SubjectOutcome("acme", "a" * 64, "failed").as_dict()["run_spend"] is None
