"""Two every-minute jobs for the missed-run drill (test_missed_runs.py): the same work under the
policies ``catch-up`` and ``skip``. The drill publishes this module under the ``runledger.jobs``
entry point, which is how `runledger serve` and its flow-run processes find them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from flows.jobs import Candidate, Job, MissedRunPolicy
from flows.model import Model
from store import OutboxMessage, Period

SUBJECTS = ("acme", "globex")
DOMAIN = "drill.example.org"
MAX_LATENESS = timedelta(minutes=3)


def _collect(subject: str, period: Period) -> dict[str, Any]:
    return {"subject": subject, "text": f"News about {subject} for {period.label}."}


def _transform(raw: dict[str, Any], model: Model) -> Candidate:
    answer = model.generate(raw["text"], system="Summarize.")
    return Candidate(answer.text, answer.model, {"subject": raw["subject"]})


def recipient(job: str, subject: str) -> str:
    return f"{subject}.{job}@{DOMAIN}"


def _job(name: str, policy: MissedRunPolicy) -> Job:
    def messages(subject: str, period: Period, output: dict[str, Any]) -> list[OutboxMessage]:
        return [OutboxMessage(recipient(name, subject), f"{name} {subject} {period.label}",
                              output["text"])]

    # While serving, a tick starts seconds after its slot on a quiet machine and can start
    # minutes late on a busy one (each flow run is a Python process of its own, started beside
    # the reconcile and delivery passes'). A served tick is on time, not missed, so the policy
    # decides only after three minutes (and reconcile does not race the schedule); what is under
    # test is what the policies do with slots nothing served, not how short the allowance can be.
    # Overdue 10 s later; the dead man's switch waits one cadence plus that grace.
    return Job(name=name, version="1", cadence="* * * * *", timezone="UTC",
               subjects=list(SUBJECTS), collect=_collect, transform=_transform,
               validate=lambda candidate: None, messages=messages, missed_runs=policy,
               grace=MAX_LATENESS + timedelta(seconds=10), max_lateness=MAX_LATENESS,
               catch_up_window=timedelta(minutes=30))


catch_up = _job("drill-catch-up", "catch-up")
skip = _job("drill-skip", "skip")
