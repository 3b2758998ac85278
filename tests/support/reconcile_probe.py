"""A job that reconcile subprocesses can load (``probe(name)`` registers it): it owes a period a
day from three days before today (UTC), catches up every one (or, with $POLICY set, follows that
missed-run policy) and calls the model. Each test names its own, so that its Runs (and their
events on the shared Prefect server) are its own."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from flows.jobs import Candidate, Job, MissedRunPolicy
from flows.jobs.budget import Budget
from flows.model import Model
from flows.registry import register
from store import OutboxMessage, Period

ENV = "RUNLEDGER_TEST_RECONCILE_PROBE"
POLICY = "RUNLEDGER_TEST_RECONCILE_POLICY"
LOAD = (f"import os; from tests.support.reconcile_probe import probe; "
        f"probe(os.environ[{ENV!r}], os.environ.get({POLICY!r}, 'catch-up')); "
        f"from flows.cli import main; main()")


SYSTEM = "Summarize."


def collect_text(subject: str, label: str) -> str:
    """The text the probe collects for a subject and period (what its model call is asked)."""
    return f"News about {subject} for {label}."


def _collect(subject: str, period: Period) -> dict[str, Any]:
    return {"subject": subject, "text": collect_text(subject, period.label)}


def _transform(raw: dict[str, Any], model: Model) -> Candidate:
    answer = model.generate(raw["text"], system=SYSTEM)
    return Candidate(answer.text, answer.model, {"subject": raw["subject"]})


def _messages(subject: str, period: Period, output: dict[str, Any]) -> list[OutboxMessage]:
    return [OutboxMessage(f"{subject}@example.com", f"{subject} {period.label}", output["text"])]


def probe(name: str, missed_runs: MissedRunPolicy = "catch-up", *,
          subjects: Sequence[str] = ("acme", "globex"), budget: Budget | None = None) -> Job:
    """Register (and return) the probe job called ``name``."""
    return register(Job(
        name=name, version="1", cadence="daily", timezone="UTC", subjects=list(subjects),
        collect=_collect, transform=_transform, validate=lambda candidate: None,
        messages=_messages, missed_runs=missed_runs, grace=timedelta(0), max_lateness=timedelta(0),
        start=datetime.now(UTC) - timedelta(days=3), budget=budget,
    ))
