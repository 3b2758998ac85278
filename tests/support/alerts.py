"""What the alert tests need: a webhook on loopback that records what it is sent, a Prefect
Custom Webhook notification block pointing at it, and jobs that do nothing but exist."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

from prefect.blocks.notifications import CustomWebhookNotificationBlock

from bench.loopback import Answer, LoopbackServer, Request
from flows.jobs import Candidate, Job
from flows.registry import register
from flows.stack.prefect_server import client
from store import OutboxMessage, Period

T = TypeVar("T")


@dataclass(frozen=True)
class Notification:
    """One POST the webhook received: the block's ``subject`` and ``body``."""

    path: str
    subject: str
    body: str


class Webhook(LoopbackServer):
    """A webhook receiver on 127.0.0.1 recording every JSON POST it is sent."""

    def __init__(self) -> None:
        super().__init__()
        self._received: list[Notification] = []
        self._lock = threading.Lock()

    def answer(self, request: Request) -> Answer:
        data = json.loads(request.body)
        with self._lock:
            self._received.append(Notification(request.path, data["subject"], data["body"]))
        return Answer(200, b"ok")

    def received(self, path: str | None = None) -> list[Notification]:
        with self._lock:
            return [n for n in self._received if path is None or n.path == path]


@contextmanager
def webhook_block(api: str, webhook: Webhook, path: str) -> Iterator[tuple[str, UUID]]:
    """A saved Custom Webhook block that POSTs ``{"subject", "body"}`` to ``webhook`` at
    ``path``: its name (as ``custom-webhook/NAME``) and id; deleted on exit."""
    name = f"ops-{uuid.uuid4().hex[:8]}"
    block = CustomWebhookNotificationBlock(
        name="runledger-ops", url=f"{webhook.origin}{path}",
        json_data={"subject": "{{subject}}", "body": "{{body}}"})
    block_id = block.save(name)
    assert isinstance(block_id, UUID), block_id  # saved from sync code: the id, not a coroutine
    try:
        yield f"custom-webhook/{name}", block_id
    finally:
        with client(api) as prefect:
            prefect.delete_block_document(block_id)


@contextmanager
def removed_automations(api: str, *names: str) -> Iterator[None]:
    """Delete the automations named ``names`` on exit, so that the session's other tests on
    the same Prefect server are not notified."""
    try:
        yield
    finally:
        with client(api) as prefect:
            for name in names:
                for automation in prefect.read_automations_by_name(name):
                    prefect.delete_automation(automation.id)


def quiet_job(*, cadence: str = "daily", subjects: tuple[str, ...] = ("acme",),
              start: datetime | None = None, grace: timedelta = timedelta(hours=1),
              due: timedelta = timedelta(0), timezone: str = "UTC",
              missed_runs: Any = "skip") -> Job:
    """A registered job under a fresh name whose stages are never meant to run."""

    def collect(subject: str, period: Period) -> dict[str, Any]:
        return {"subject": subject}

    def transform(raw: dict[str, Any], model: Any) -> Candidate:
        return Candidate(f"about {raw['subject']}", "none")

    def validate(candidate: Candidate) -> None:
        return None

    def messages(subject: str, period: Period, output: dict[str, Any]) -> list[OutboxMessage]:
        return []

    return register(Job(
        name=f"alerted-{uuid.uuid4().hex[:8]}", version="1", cadence=cadence, timezone=timezone,
        subjects=list(subjects), collect=collect, transform=transform, validate=validate,
        messages=messages, start=start, grace=grace, due=due, missed_runs=missed_runs))
