"""The dispatcher processes of drill 4's SIGKILL part for webhooks: delivery passes to a webhook
receiver on loopback until told to stop, each process started by ``armed.run_armed`` with the
fault point between the receiver's acceptance and the sent mark armed (or none)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from flows.delivery.dispatcher import Dispatcher
from flows.delivery.policy import RetryPolicy
from store import Ledger
from tests.support.channels import webhook_transport

TIMEOUT = 0.5
LEASE = 2.5  # at least twice a lookup and a POST (2 x 2 x TIMEOUT)
POLICY = RetryPolicy(max_attempts=8, base_delay=0.05, max_delay=0.2, max_window=3600)


def dispatcher(db_url: str, receiver_url: str, lookup: str, stop: str) -> None:
    """Delivery passes until the file ``stop`` exists."""
    with Ledger.connect(db_url) as ledger:
        while not Path(stop).exists():
            transport = webhook_transport(receiver_url, lookup=lookup == "1",
                                          timeout=TIMEOUT, max_timeout=TIMEOUT)
            pass_ = Dispatcher(ledger, transport, POLICY, lease_seconds=LEASE, mark_batch=5)
            asyncio.run(pass_.run_pass(batch_size=10, max_seconds=5))
            time.sleep(0.05)
