"""What a tick does about its job's budget: the estimator each subject's calls reserve with, the
words a refused subject, its flow run's OverBudget state and the once-per-window
``runledger.budget.exhausted`` event say (how much was spent of what cap, and how to raise it),
and what the ``runledger.budget.overrun`` event says of an answer billed beyond its bound."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flows.jobs.budget import Budget, Estimator, spent_text
from flows.model import CallBound
from flows.prices import PriceList
from store import OVER_BUDGET_ERROR, BudgetExhausted, Period, Usage

OVER_BUDGET_STATE = "OverBudget"


def estimator(job: str, budget: Budget, prices: PriceList, period: Period,
              now: datetime) -> Estimator:
    """The estimator of one tick's calls: its period's window, and the UTC day of ``now`` (the
    database clock when the tick started)."""
    return Estimator(job, budget, prices, period.start, now)


def refusal_text(budget: Budget, refused: BudgetExhausted) -> str:
    """Why a subject ended over-budget and how to go on."""
    r = refused.refusal
    window = f"{r.window.scope} budget from {r.window.start.isoformat()}"
    spent = spent_text(budget, r.spent + r.reserved, r.window.cap, r.currency)
    return (f"{OVER_BUDGET_ERROR}the {window} has {spent}, no room for a call of about "
            f"{budget.shown(r.estimate, r.currency)}; {raise_hint(r.job, r.window.scope)}")


def raise_hint(job: str, scope: str) -> str:
    """How to go on after a refusal: raise the cap and reconcile (which re-drives the job's
    pending Runs of every period in its catch-up window), or, for a day's cap, let the next
    UTC day's budget do it. A period's window never resets: its Runs wait for a raised cap."""
    fix = (f"raise the cap (the job's Budget(per_{scope}=...)) and run "
           f"`runledger reconcile {job}`")
    if scope == "period":
        return f"{fix} to finish it; the next period has a budget of its own"
    return f"{fix} to finish it now, or reconcile runs it once the next UTC day has room"


def exhausted_payload(budget: Budget, refused: BudgetExhausted) -> dict[str, Any]:
    """The ``runledger.budget.exhausted`` event's payload."""
    r = refused.refusal
    return {"scope": r.window.scope, "window_start": r.window.start.isoformat(),
            "unit": r.unit, "currency": r.currency, "cap": r.window.cap,
            "spent": spent_text(budget, r.spent + r.reserved, r.window.cap, r.currency),
            "refused": 1, "fix": raise_hint(r.job, r.window.scope)}


def overrun_payload(endpoint: str, model: str, subject: str, call_id: str, bound: CallBound,
                    usage: Usage) -> dict[str, Any]:
    """The ``runledger.budget.overrun`` event's payload: a provider billed a call beyond the
    bound it reserved (it did not honour ``max_tokens``), so a cap may have been passed."""
    return {"endpoint": endpoint, "model": model, "subject": subject, "call_id": call_id,
            "input_bound": bound.input_tokens, "max_tokens": bound.max_tokens,
            "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "overrun_tokens": usage.overrun,
            "fix": "check that the endpoint honours max_tokens (RUNLEDGER_MODEL_MAX_TOKENS, or "
                   "the endpoint's max_tokens); `runledger costs` counts these calls"}
