"""Helpers of the webhook and object-storage delivery tests: queue a Run's messages through a
real completion, and a webhook transport whose endpoints resolve in process (a receiver on
loopback) instead of from Prefect blocks. Light on imports: drill processes start from it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import SecretStr

from flows.delivery.dispatcher import Dispatcher
from flows.delivery.policy import RetryPolicy
from flows.delivery.report import DeliveryReport
from flows.errors import DeliveryConfigurationError
from flows.webhook.block import endpoint_settings
from flows.webhook.settings import WebhookSettings
from flows.webhook.transport import WebhookTransport
from store import Ledger, OutboxMessage, QueuedMessage, RunIdentity
from tests.support.webhook_receiver import SECRET

ENDPOINT = "reports-api"
FAST = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02, max_window=3600)


def complete_with(ledger: Ledger, messages: Sequence[OutboxMessage]) -> list[QueuedMessage]:
    """Complete a fresh Run with ``messages``; its outbox rows, oldest first."""
    identity = RunIdentity("digest", f"subject-{uuid.uuid4().hex[:8]}",
                           datetime(2026, 1, 5, 9, tzinfo=UTC), "v1")
    ledger.register(identity)
    claim = ledger.claim(identity.run_id, "test-worker", 60)
    assert claim is not None
    ledger.complete(claim, {"summary": "ok"}, list(messages))
    return ledger.outbox.messages(run_id=identity.run_id, limit=len(messages) + 1)


def webhooks(count: int, endpoint: str = ENDPOINT) -> list[OutboxMessage]:
    """``count`` webhook messages to one endpoint (each its own target: one per endpoint and
    Run, so a Run's many webhooks go to as many endpoint names)."""
    return [OutboxMessage.webhook(f"{endpoint}-{i}" if count > 1 else endpoint,
                                  {"n": i, "summary": f"report {i}"}) for i in range(count)]


def webhook_transport(url: str, *, lookup: bool = True, timeout: float = 5.0,
                      max_timeout: float = 5.0, **overrides: Any) -> WebhookTransport:
    """A transport whose every endpoint name starting with ``reports-api`` is the receiver at
    ``url`` (signed with the receiver's secret), waiting up to 5 s for an answer (a loaded
    machine's; the 30-s delivery lease holds two sends of the longest)."""
    values: dict[str, Any] = {"url": url, "secret": SecretStr(SECRET),
                              "lookup_url": "{url}/{key}" if lookup else None,
                              "timeout": timeout} | overrides

    async def resolve(name: str) -> WebhookSettings:
        if not name.startswith(ENDPOINT):
            raise DeliveryConfigurationError(f"no webhook endpoint block named {name!r}")
        return endpoint_settings(name=name, **values)

    return WebhookTransport(resolve, max_timeout=max_timeout)


def deliver_with(ledger: Ledger, transport: Any, *, policy: RetryPolicy = FAST,
                 lease_seconds: float = 30.0, batch_size: int = 100,
                 max_seconds: float = 30.0) -> DeliveryReport:
    """One dispatcher pass of the transport's channel, started once whatever an earlier pass
    put back with the policy's short delays is due again (a pass tries only due messages)."""
    time.sleep(min(policy.max_delay, 0.1) + 0.01)
    dispatcher = Dispatcher(ledger, transport, policy, lease_seconds=lease_seconds)
    return asyncio.run(dispatcher.run_pass(batch_size, max_seconds))
