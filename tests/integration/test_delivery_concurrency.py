"""Several dispatchers at once: each outbox message is leased to one of them and sent once."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from flows.delivery.report import DeliveryReport
from flows.mail.sink import Sink
from store import Ledger
from tests.support.delivery import dispatcher, queue, statuses

MESSAGES = 2000 if os.environ.get("RUNLEDGER_FULL") == "1" else 500


@pytest.mark.timeout(300)
def test_two_dispatchers_at_once_send_every_message_exactly_once(db_url: str, ledger: Ledger) -> None:
    """Two dispatchers (own engines, own SMTP connections) start together over 500 messages:
    the sink receives 500 messages with 500 distinct Message-IDs, and both took part."""
    queue(ledger, MESSAGES)
    start = threading.Barrier(2)
    reports: list[DeliveryReport] = []
    errors: list[BaseException] = []

    def run(sink: Sink) -> None:
        own = Ledger.connect(db_url)
        try:
            worker = dispatcher(own, sink)
            start.wait(timeout=30)
            reports.append(asyncio.run(worker.run_pass(batch_size=25, max_seconds=240)))
        except BaseException as exc:
            errors.append(exc)
        finally:
            own.close()

    with Sink(dedupe=True) as sink:
        threads = [threading.Thread(target=run, args=(sink,)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=280)
        assert not errors, errors
        assert sink.stats["received"] == MESSAGES
        assert sink.stats["unique"] == MESSAGES
    assert statuses(ledger) == {"sent": MESSAGES}
    assert sum(r.counts["sent"] for r in reports) == MESSAGES
    assert all(r.counts["sent"] > 0 for r in reports), [r.counts for r in reports]
    assert all(r.counts["lost"] == 0 for r in reports)
