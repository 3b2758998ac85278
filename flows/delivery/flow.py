"""The ``deliver-outbox`` Prefect flow: one dispatcher pass per channel per flow run (the channels
of RUNLEDGER_DELIVERY_CHANNELS, side by side; deploy it on an interval schedule, separately from
the jobs), a summary artifact, and one event per outcome."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact
from prefect.events import emit_event

from flows.delivery.dispatcher import Dispatcher
from flows.delivery.report import Delivery, DeliveryReport
from flows.mail.block import SmtpServer
from flows.mail.errors import MailConfigurationError
from flows.mail.settings import SmtpSettings
from store import Ledger

ARTIFACT_KEY = "deliver-outbox-summary"
EVENT_PREFIX = "runledger.outbox"


def message_resource(delivery: Delivery) -> dict[str, str]:
    return {"prefect.resource.id": f"runledger.outbox.message.{delivery.message_id}",
            "prefect.resource.name": delivery.message_id[:12]}


def run_resource(run_id: str) -> dict[str, str]:
    return {"prefect.resource.id": f"runledger.run.{run_id}", "prefect.resource.role": "run"}


def announce(delivery: Delivery) -> None:
    """Emit ``runledger.outbox.<status>`` for a recorded outcome (resource: the message;
    related: its logical run; the flow run is attached by Prefect)."""
    payload: dict[str, Any] = {"attempt": delivery.attempt, "status": delivery.status.value,
                               "channel": delivery.channel, "recipient": delivery.recipient}
    if delivery.error:
        payload["error"] = delivery.error
    if delivery.reply_code is not None:
        payload["reply_code"] = delivery.reply_code
    if delivery.delay is not None:
        payload["next_attempt_in_seconds"] = round(delivery.delay, 3)
    emit_event(f"{EVENT_PREFIX}.{delivery.status.value}", resource=message_resource(delivery),
               related=[run_resource(delivery.run_id)], payload=payload)


async def smtp_settings(block_name: str) -> SmtpSettings:
    block: object = await SmtpServer.aload(block_name)
    if not isinstance(block, SmtpServer):
        raise MailConfigurationError(f"block {block_name!r} is not a runledger SMTP server block")
    return block.settings()


@flow(name="deliver-outbox", log_prints=True)
async def deliver_outbox(
    batch_size: int = 100, max_seconds: float = 50.0, smtp_block: str | None = None
) -> dict[str, int]:
    """Deliver due outbox messages until none is due or ``max_seconds`` pass.

    Args:
        batch_size: Messages claimed per batch; each batch is leased to this run.
        max_seconds: Stop claiming new batches after this many seconds (keep it below the
            schedule interval so that runs rarely overlap; overlapping runs are still safe).
        smtp_block: Name of a saved "runledger SMTP server" block; empty means the
            RUNLEDGER_SMTP_* environment of the worker.
    """
    logger = get_run_logger()
    smtp = await smtp_settings(smtp_block) if smtp_block else None
    ledger = Ledger.open_existing()
    try:
        dispatchers = Dispatcher.for_channels(ledger, smtp=smtp, observer=announce)
        for dispatcher in dispatchers:
            logger.info("dispatcher %s: %s via %s", dispatcher.owner, dispatcher.channel,
                        dispatcher.transport.name)
        # One pass per channel, side by side: a slow webhook does not hold the email back.
        reports: list[DeliveryReport] = await asyncio.gather(*[
            d.run_pass(batch_size=batch_size, max_seconds=max_seconds) for d in dispatchers])
    finally:
        ledger.close()
    await acreate_markdown_artifact(
        markdown="\n\n".join(r.markdown() for r in reports), key=ARTIFACT_KEY,
        description="Outbox messages sent, retried, uncertain and dead in this run, per channel",
    )
    counts: Counter[str] = Counter()
    for report in reports:
        logger.info("delivery %s: %s", report.channel, report.counts)
        if report.stopped:
            logger.warning("%s stopped early: %s", report.channel, report.stopped)
        counts.update(report.counts)
    return dict(counts)
