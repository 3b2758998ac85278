"""Helpers for the pipeline and model tests: a real OpenAI-compatible HTTP server with scripted
replies, probe jobs that count their stage calls, and a `runledger run` worker subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from prefect.client.schemas.objects import State

from bench.loopback import Answer, Request, ScriptedServer, json_answer
from bench.structured import answer_text
from flows.jobs import Candidate, Job
from flows.jobs.competitor_summary import SAMPLE_DATA
from flows.jobs.competitor_summary import job as competitor_summary
from flows.model import Model
from flows.registry import register, upgrade_ledger
from flows.run_job.flow import run_job
from flows.run_job.outcomes import TickReport, state_value
from store import Ledger, OutboxMessage, Period, Run
from tests.support import waiting
from tests.support.ledger import model_calls

RUNLEDGER = [sys.executable, "-c", "from flows.cli import main; main()"]
SUMMARY = "competitor-summary"
ACME = ["ceo@acme.example", "product-team@acme.example"]


USAGE = {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}


@dataclass
class Reply:
    """One scripted answer of the model server."""

    status: int = 200
    text: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    raw: bytes | None = None
    # The answer's ``usage`` field, as the server reports it (None: a server that reports none).
    usage: dict[str, Any] | None = field(default_factory=lambda: dict(USAGE))
    # The model's refusal (OpenAI's ``message.refusal``): sent with no content.
    refusal: str | None = None


class ModelServer(ScriptedServer[Reply]):
    """An OpenAI-compatible chat-completions endpoint on loopback. Scripted replies are served
    first; afterwards every call answers ``answer N`` (N counts the requests), as a document of
    the request's JSON schema when it asks for structured output."""

    def __init__(self) -> None:
        super().__init__(Reply)

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    def answer(self, request: Request) -> Answer:
        count, asked, reply = self.next_reply(request)
        if reply.status == 200:
            text = answer_text(asked, f"answer {count}") if reply.text is None else reply.text
            message: dict[str, Any] = (
                {"role": "assistant", "content": text} if reply.refusal is None
                else {"role": "assistant", "content": None, "refusal": reply.refusal})
            body: dict[str, Any] = {"model": "probe-model", "choices": [
                {"index": 0, "message": message}]}
            if reply.usage is not None:
                body["usage"] = reply.usage
        else:
            body = {"error": {"message": f"status {reply.status}"}}
        return json_answer(reply.status, body, reply.headers, reply.delay, raw=reply.raw)


@dataclass
class Probe:
    """A job registered under a fresh name that records what its stages were asked to do."""

    job: Job
    collects: list[str]
    transforms: list[str]

    @property
    def name(self) -> str:
        return self.job.name


def probe_job(
    subjects: Sequence[str] = ("acme",),
    recipients: Sequence[str] = ("a@example.com", "b@example.com"),
    *,
    transform_errors: Sequence[BaseException] = (),
    effect: Callable[..., None] | None = None,
    tables: Any = None,
    on_collect: Callable[[str], None] | None = None,
    **options: Any,
) -> Probe:
    """A probe job: collect records the subject (then calls ``on_collect`` with it, if given);
    transform raises ``transform_errors`` in turn (if any), then asks the model; one email
    per recipient. ``options`` are further Job fields (missed_runs, start, due, grace...)."""
    collects: list[str] = []
    transforms: list[str] = []
    errors = list(transform_errors)

    def collect(subject: str, period: Period) -> dict[str, Any]:
        collects.append(subject)
        if on_collect is not None:
            on_collect(subject)
        return {"subject": subject, "text": f"News about {subject}. Prices went up today."}

    def transform(raw: dict[str, Any], model: Model) -> Candidate:
        transforms.append(raw["subject"])
        if errors:
            raise errors.pop(0)
        answer = model.generate(raw["text"], system="Summarize.")
        return Candidate(answer.text, answer.model, {"subject": raw["subject"]})

    def validate(candidate: Candidate) -> None:
        from flows.jobs import ValidationFailed

        if not candidate.text:
            raise ValidationFailed("empty summary")

    def messages(subject: str, period: Period, output: dict[str, Any]) -> list[OutboxMessage]:
        return [OutboxMessage(r, f"{subject} {period.label}", output["text"]) for r in recipients]

    job = Job(**{
        "name": f"probe-{uuid.uuid4().hex[:10]}", "version": "1", "cadence": "daily",
        "timezone": "UTC", "subjects": list(subjects), "collect": collect,
        "transform": transform, "validate": validate, "messages": messages,
        "params": lambda s, p: {"recipients": sorted(recipients)}, "effect": effect,
        "tables": tables, **options,
    })
    register(job)
    return Probe(job, collects, transforms)


def copy_sample_data(target: Path) -> Path:
    shutil.copytree(SAMPLE_DATA, target)
    return target


def outbox_recipients(ledger: Ledger, run_id: str) -> list[str]:
    return sorted(m.recipient for m in ledger.outbox.messages(run_id=run_id, limit=1000))


@dataclass
class Worker:
    """A `runledger run ... --json` subprocess: a worker that tests can stop, resume or kill."""

    process: subprocess.Popen[str]

    @classmethod
    def start(cls, args: Sequence[str]) -> Worker:
        """Start `runledger run ARGS --json` with this process's environment."""
        process = subprocess.Popen(
            [*RUNLEDGER, "run", *args, "--json"], env=dict(os.environ),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        return cls(process)

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, signum: signal.Signals) -> None:
        self.process.send_signal(signum)

    def finish(self, timeout: float = 120) -> tuple[int, dict[str, Any] | None, str]:
        out, err = self.process.communicate(timeout=timeout)
        try:
            report = json.loads(out) if out.strip() else None
        except json.JSONDecodeError:
            report = None
        return self.process.returncode, report, err

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate(timeout=30)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """``waiting.wait_until`` polling every 0.05 s: the pipeline's tests catch a worker at a
    stage before it moves on."""
    waiting.wait_until(condition, timeout, what, every=0.05)


def lease_expired(ledger: Ledger, run_id: str) -> bool:
    run = ledger.get(run_id)
    return run.lease_expires_at is None or run.lease_expires_at <= ledger.database.now()


@dataclass
class Env:
    """A test's pipeline environment: its ledger and sample data copy."""

    ledger: Ledger
    source: Path
    monkeypatch: pytest.MonkeyPatch

    def set(self, **values: Any) -> None:
        """Set RUNLEDGER_<NAME> variables, read by the next flow run in this process or a worker."""
        for name, value in values.items():
            self.monkeypatch.setenv(f"RUNLEDGER_{name.upper()}", str(value))

    def run(self, job: str, subjects: list[str] | None = None,
            period: str | None = None) -> tuple[State[Any], TickReport | BaseException]:
        state = final_state(run_job(job=job, subjects=subjects, period=period, return_state=True))
        return state, state_value(state)

    def the_run(self, subject: str, period: str, job: Job = competitor_summary) -> Run:
        return self.ledger.get(job.identity(subject, job.parse_period(period)).run_id)

    def model_calls(self) -> int:
        """The model calls that left a process, as the ledger recorded them (any outcome)."""
        return len(model_calls(self.ledger))

    def calls(self) -> list[dict[str, Any]]:
        """The ledger's model call records, oldest first, with subject and caller's pid."""
        return model_calls(self.ledger)


@contextmanager
def pipeline_env(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    """A fresh ledger with the jobs' own tables (as `runledger db upgrade` makes them), a copy
    of the sample data and fast retries."""
    ledger = Ledger.connect(db_url)
    upgrade_ledger(ledger)
    env = Env(ledger, copy_sample_data(tmp_path / "source"), monkeypatch)
    monkeypatch.setenv("RUNLEDGER_DATABASE_URL", db_url)
    env.set(competitor_summary_source=env.source,
            retry_delay_seconds=0.05, task_retries=2)
    try:
        yield env
    finally:
        ledger.close()


def final_state(call: Awaitable[State[Any]]) -> State[Any]:
    """The final state of a flow called with ``return_state=True`` from sync code: Prefect
    types the call as an awaitable, and asyncio.run takes the coroutine it is."""
    return asyncio.run(cast("Coroutine[Any, Any, State[Any]]", call))


def status_boards(job: str) -> list[list[dict[str, Any]]]:
    """Every version of the job's status board artifact on the Prefect server, newest first,
    each as its table's rows."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"runledger-status-{job}"])),
            sort=ArtifactSort.CREATED_DESC)
    return [json.loads(a.data) if isinstance(a.data, str) else cast("list[dict[str, Any]]", a.data)
            for a in found]


def outcomes(report: TickReport | BaseException) -> dict[str, str]:
    assert isinstance(report, TickReport), report
    return {s.subject: s.outcome for s in report.subjects}
