"""Helpers shared by the delivery tests: queue outbox messages through a real Run completion,
build dispatchers against an in-process SMTP sink, and a provider transport to a loopback
server."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.loopback import LoopbackServer
from flows.delivery.dispatcher import Dispatcher
from flows.delivery.policy import RetryPolicy
from flows.delivery.report import DeliveryReport
from flows.mail.provider import ProviderTransport
from flows.mail.settings import ProviderSettings, SmtpSettings, TlsMode
from flows.mail.sink import Sink
from flows.mail.smtp import SmtpTransport
from flows.transport import Transport
from store import Ledger, OutboxMessage, QueuedMessage, RunIdentity
from tests.support.killed import run_killed

SENDER = "jobs@example.com"
# Tiny delays so that a retried message is due again within a test.
FAST = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02, max_window=3600)
RUNLEDGER = [sys.executable, "-c", "from flows.cli import main; main()"]
API_KEY = "re_test_key"  # the provider transport's key; a test checks it is never printed


def transport(provider: LoopbackServer, **overrides: Any) -> ProviderTransport:
    """A transport to the email provider API that ``provider`` serves on loopback, waiting 7 s
    for an answer: what a loaded machine may take, and a quarter of the tests' 30-s delivery
    lease (a test of the timeout sets its own)."""
    values: dict[str, Any] = {"url": provider.origin, "api_key": API_KEY,
                              "mail_from": SENDER, "timeout": 7.0}
    values.update(overrides)
    return ProviderTransport(ProviderSettings(**values))


def recipient(i: int) -> str:
    return f"user{i:04d}@example.com"


def queue(ledger: Ledger, count: int, *, body: str = "Hello\n",
          hold: timedelta | None = None) -> list[QueuedMessage]:
    """Complete a fresh Run with ``count`` outbox messages (one per recipient), held for a
    person's approval when ``hold`` is given."""
    identity = RunIdentity("digest", f"subject-{uuid.uuid4().hex[:8]}",
                           datetime(2026, 1, 5, 9, tzinfo=UTC), "v1")
    ledger.register(identity)
    claim = ledger.claim(identity.run_id, "test-worker", 60)
    assert claim is not None
    messages = [OutboxMessage(recipient=recipient(i), subject=f"Digest {i}", body=body, hold=hold)
                for i in range(count)]
    ledger.complete(claim, {"summary": "ok"}, messages)
    return ledger.outbox.messages(run_id=identity.run_id, limit=count)


def smtp_settings(sink: Sink, **overrides: Any) -> SmtpSettings:
    values: dict[str, Any] = {"host": sink.host, "port": sink.port, "tls": TlsMode.NONE,
                              "mail_from": SENDER, "timeout": 2.0}
    values.update(overrides)
    return SmtpSettings(**values)


def dispatcher(ledger: Ledger, sink: Sink | None = None, *, transport: Transport[Any] | None = None,
               policy: RetryPolicy = FAST, lease_seconds: float = 30.0,
               **settings: Any) -> Dispatcher:
    if transport is None:
        assert sink is not None
        transport = SmtpTransport(smtp_settings(sink, **settings))
    return Dispatcher(ledger, transport, policy, lease_seconds=lease_seconds)


def deliver(ledger: Ledger, sink: Sink | None = None, *, batch_size: int = 100,
            max_seconds: float = 30.0, **options: Any) -> DeliveryReport:
    """One dispatcher pass."""
    return asyncio.run(dispatcher(ledger, sink, **options).run_pass(batch_size, max_seconds))


def statuses(ledger: Ledger) -> dict[str, int]:
    return {k: v for k, v in ledger.outbox.message_counts().items() if v}


def cli_env(db_url: str, sink: Sink, **extra: str) -> dict[str, str]:
    """The environment of a `runledger` subprocess that delivers to ``sink``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLEDGER_")}
    env.update(
        RUNLEDGER_DATABASE_URL=db_url, RUNLEDGER_SMTP_HOST=sink.host,
        RUNLEDGER_SMTP_PORT=str(sink.port), RUNLEDGER_SMTP_TLS="none", RUNLEDGER_MAIL_FROM=SENDER,
        RUNLEDGER_SMTP_TIMEOUT="2", PYTHONPATH=str(Path(__file__).resolve().parents[2]),
    )
    env.update(extra)
    return env


def deliver_killed_after_send(db_url: str, sink: Sink, lease_seconds: float,
                              smtp_timeout: float) -> None:
    """A `runledger deliver` process SIGKILLed at after_send_before_mark: the receiver accepted
    its first message, which the ledger never marked sent (its batch stays leased)."""
    env = cli_env(db_url, sink, RUNLEDGER_FAULTS="after_send_before_mark",
                  RUNLEDGER_DELIVERY_LEASE_SECONDS=str(lease_seconds),
                  RUNLEDGER_SMTP_TIMEOUT=str(smtp_timeout))
    killed = run_killed([*RUNLEDGER, "deliver"], env, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr


def deliver_until_sent(ledger: Ledger, sink: Sink, count: int, lease_seconds: float,
                       smtp_timeout: float, within: float) -> None:
    """Delivery passes until all ``count`` messages are sent (the killed pass's batch is
    claimable once its lease expires); fails after ``within`` seconds naming the statuses."""
    deadline = time.monotonic() + within
    while statuses(ledger) != {"sent": count}:
        assert time.monotonic() < deadline, \
            f"waited {within:.0f} s for {count} sent messages: {statuses(ledger)}"
        time.sleep(0.25)
        deliver(ledger, sink, lease_seconds=lease_seconds, timeout=smtp_timeout)
