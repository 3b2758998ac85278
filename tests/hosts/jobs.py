"""The cluster's jobs, one per scenario, published under the ``runledger.jobs`` entry point (the
harness puts a distribution's metadata on every host's PYTHONPATH), which is how the workers'
flow-run processes find them. Each subject's text asks the model host to answer after a delay
(``delay=S``): a transform then holds its lease while the network is broken around it. Sizes
and delays come from the hosts' environment, so one module serves the reduced and full runs.

    RUNLEDGER_HOSTS_JOBS='{"hosts-partition-db": [12, 4.0], ...}'   # subjects, model seconds"""

from __future__ import annotations

import json
import os
from typing import Any

from flows.jobs import Candidate, Job
from flows.model import Model
from store import OutboxMessage, Period

ENV = "RUNLEDGER_HOSTS_JOBS"
DOMAIN = "hosts.example.org"


def recipient(job: str, subject: str) -> str:
    """One recipient per Run: the checker expects one outbox row each."""
    return f"{subject}.{job}@{DOMAIN}"


def subjects(size: int) -> list[str]:
    return [f"s{i:04d}" for i in range(size)]


def job(name: str, size: int, delay: float) -> Job:
    """The scenario job ``name``: ``size`` subjects, each transform asking the model host to
    answer after ``delay`` seconds."""

    def collect(subject: str, period: Period) -> dict[str, Any]:
        return {"subject": subject, "text": f"delay={delay} {subject} for {period.label}."}

    def transform(raw: dict[str, Any], model: Model) -> Candidate:
        answer = model.generate(raw["text"], system="Summarize.")
        return Candidate(answer.text, answer.model, {"subject": raw["subject"]})

    def messages(subject: str, period: Period, output: dict[str, Any]) -> list[OutboxMessage]:
        return [OutboxMessage(recipient(name, subject), f"{name} {subject} {period.label}",
                              output["text"])]

    return Job(name=name, version="1", cadence="daily", timezone="UTC",
               subjects=subjects(size), collect=collect, transform=transform,
               validate=lambda candidate: None, messages=messages)


for _name, (_size, _delay) in json.loads(os.environ.get(ENV, "{}")).items():
    globals()[_name.replace("-", "_")] = job(_name, int(_size), float(_delay))
