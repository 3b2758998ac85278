"""The dispatcher: claim due outbox messages with a delivery lease, send each with its stable key,
and record the classified outcome with the lease's fence. No Prefect here: the flow and
`runledger deliver` both run ``Dispatcher.run_pass``."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from flows.delivery.policy import Decision, RetryPolicy, Status
from flows.delivery.report import Delivery, DeliveryReport
from flows.delivery.settings import DeliverySettings, open_transport
from flows.errors import DeliveryConfigurationError
from flows.mail.settings import SmtpSettings, load_settings
from flows.transport import OutcomeKind, SendOutcome, Transport
from store import (
    AFTER_SEND_BEFORE_MARK,
    DeliveryLeaseLost,
    Ledger,
    MessageClaim,
    Reply,
    RunledgerError,
    fault_point,
)

log = logging.getLogger("runledger.delivery")

Observer = Callable[[Delivery], None]
Accepted = list[tuple[MessageClaim, SendOutcome]]  # sent, not yet marked
LEASE_MARGIN_SECONDS = 1.0
# An accepted message waits at most this long (or for ``mark_batch`` others) before its sent
# mark starts committing; with one group committing while the next fills, a crash can make us
# resend at most 2 x mark_batch accepted messages (each with its same Message-ID).
MARK_DELAY_SECONDS = 0.1


def dispatcher_owner() -> str:
    """host:pid:random, unique per dispatcher even with several in one process."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Dispatcher:
    """Delivers one channel's outbox messages through its transport. Several dispatchers may run
    at once: each message is leased to one of them, and only the lease holder's outcome is
    recorded."""

    def __init__(
        self,
        ledger: Ledger,
        transport: Transport[Any],
        policy: RetryPolicy,
        *,
        lease_seconds: float = 600.0,
        owner: str | None = None,
        observer: Observer | None = None,
        rng: random.Random | None = None,
        mark_batch: int = 20,
    ) -> None:
        policy.check_retention(transport.key_retention_seconds, transport.name)
        if lease_seconds < 2 * transport.send_reserve_seconds:
            raise DeliveryConfigurationError(
                f"the delivery lease ({lease_seconds:g} s, RUNLEDGER_DELIVERY_LEASE_SECONDS) must be "
                f"at least twice the longest send ({transport.send_reserve_seconds:g} s from the "
                "transport timeout), or messages would be taken over while still being sent"
            )
        self.ledger = ledger
        self.transport = transport
        self.policy = policy
        self.lease_seconds = lease_seconds
        self.channel = transport.channel
        self.owner = owner or dispatcher_owner()
        self.observer = observer
        self.rng = rng or random.Random()
        if mark_batch < 1:
            raise ValueError(f"mark_batch must be at least 1, got {mark_batch}")
        self.mark_batch = mark_batch
        self._unmarked: Accepted = []
        self._unmarked_since = 0.0
        self._marking: tuple[Accepted, asyncio.Future[list[MessageClaim]]] | None = None
        self._marker: ThreadPoolExecutor | None = None
        self._tried: set[str] = set()

    @classmethod
    def from_settings(
        cls, ledger: Ledger, *, channel: str = "email", smtp: SmtpSettings | None = None,
        observer: Observer | None = None,
    ) -> Dispatcher:
        """A dispatcher of ``channel`` configured from RUNLEDGER_DELIVERY_* and the transport's
        settings (``smtp`` overrides RUNLEDGER_SMTP_*, e.g. from a Prefect block)."""
        settings = load_settings(DeliverySettings)
        return cls(ledger, open_transport(settings, channel, smtp), settings.policy(),
                   lease_seconds=settings.lease_seconds, observer=observer,
                   mark_batch=settings.mark_batch)

    @classmethod
    def for_channels(
        cls, ledger: Ledger, *, smtp: SmtpSettings | None = None,
        observer: Observer | None = None,
    ) -> list[Dispatcher]:
        """One dispatcher per channel of RUNLEDGER_DELIVERY_CHANNELS."""
        settings = load_settings(DeliverySettings)
        return [cls.from_settings(ledger, channel=channel, smtp=smtp, observer=observer)
                for channel in settings.channel_list]

    async def run_pass(self, batch_size: int = 100, max_seconds: float = 60.0) -> DeliveryReport:
        """Deliver batches until nothing is due or ``max_seconds`` pass. Each message is tried at
        most once per pass; a ``DeliveryConfigurationError`` stops the pass after giving back every
        untried claim."""
        if batch_size < 1 or max_seconds <= 0:
            raise ValueError(f"batch_size must be >= 1 and max_seconds > 0, got {batch_size}, "
                             f"{max_seconds}")
        started = time.monotonic()
        deadline = started + max_seconds
        report = DeliveryReport(owner=self.owner, transport=self.transport.name,
                                channel=self.channel)
        self._tried = set()
        # Claims of the next batch and sent marks run on this thread while messages are sent.
        self._marker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runledger-ledger")
        try:
            upcoming: tuple[float, asyncio.Future[list[MessageClaim]]] | None
            upcoming = self._claim_ahead(batch_size)
            while upcoming is not None:
                (leased_at, claiming), upcoming = upcoming, None
                claims = await claiming
                if not claims:
                    break
                if time.monotonic() >= deadline or report.stopped is not None:
                    self._release(claims, report)
                    break
                again = [c for c in claims if c.message_id in self._tried]
                self._release(again, report)
                fresh = [c for c in claims if c.message_id not in self._tried]
                if not fresh:
                    break  # everything due now was already tried in this pass
                if len(claims) == batch_size:  # more may be due: claim it while this batch goes
                    upcoming = self._claim_ahead(batch_size)
                try:
                    await self._deliver_batch(fresh, leased_at, deadline, report)
                except BaseException:
                    if upcoming is not None:
                        self._release(await upcoming[1], report)
                    raise
                if upcoming is None and report.stopped is None and time.monotonic() < deadline:
                    upcoming = self._claim_ahead(batch_size)
        finally:
            self._marker.shutdown(wait=True)
            report.seconds = time.monotonic() - started
            await self.transport.aclose()
        log.info("delivery pass %s: %s", self.owner, report.counts)
        return report

    def _claim_ahead(self, batch_size: int) -> tuple[float, asyncio.Future[list[MessageClaim]]]:
        """Start claiming a batch; the lease is counted from now (it starts no earlier)."""
        assert self._marker is not None
        claiming = asyncio.get_running_loop().run_in_executor(
            self._marker, self.ledger.outbox.claim_messages, self.owner, batch_size,
            self.lease_seconds, self.channel)
        return time.monotonic(), claiming

    async def _deliver_batch(self, claims: Sequence[MessageClaim], leased_at: float,
                             deadline: float, report: DeliveryReport) -> None:
        try:
            await self._send_each(claims, leased_at, deadline, report)
        finally:
            await self._mark_sent(report)  # accepted messages are marked even if the pass fails

    async def _send_each(self, claims: Sequence[MessageClaim], leased_at: float,
                         deadline: float, report: DeliveryReport) -> None:
        for index, claim in enumerate(claims):
            rest = claims[index:]
            if self._unmarked and time.monotonic() - self._unmarked_since > MARK_DELAY_SECONDS:
                await self._mark_sent(report, wait=False)
            if time.monotonic() >= deadline:
                self._release(rest, report)
                return
            lease_left = self.lease_seconds - (time.monotonic() - leased_at)
            if lease_left < self.transport.send_reserve_seconds + LEASE_MARGIN_SECONDS:
                self._release(rest, report)  # claim them again with a fresh lease
                return
            self._tried.add(claim.message_id)
            try:
                outcome = await self._attempt(claim)
            except DeliveryConfigurationError as exc:
                self._release(rest, report)
                report.stopped = str(exc)
                raise
            except BaseException:
                # Cancelled mid-send: this message's fate is unknown, so it stays leased until
                # the lease expires; the untried ones go back now.
                self._release(claims[index + 1:], report)
                raise
            await self._record(claim, outcome, report)
            if outcome.unreachable:
                self._release(claims[index + 1:], report)
                report.stopped = f"transport unreachable: {outcome.summary}"
                return
            if outcome.retry_after:
                if time.monotonic() + outcome.retry_after >= deadline:
                    self._release(claims[index + 1:], report)
                    report.stopped = f"receiver asked to wait {outcome.retry_after:g} s"
                    return
                await asyncio.sleep(outcome.retry_after)

    async def _attempt(self, claim: MessageClaim) -> SendOutcome:
        """One attempt: when an earlier one may have arrived, the receiver is asked first (where
        it can say) and a message it has is not sent again; then the send."""
        item = self.transport.render(claim)
        if claim.attempt > 1:
            settled = await self.transport.settle(item)
            if settled is not None:
                return replace(settled, settled=True)
        return await self.transport.send(item)

    async def _record(self, claim: MessageClaim, outcome: SendOutcome,
                      report: DeliveryReport) -> None:
        """Write the outcome, then tell (invariant 9). Sent marks are committed in groups of up to
        ``mark_batch`` while the next messages go out; every other outcome is written at once,
        after the marks before it."""
        if outcome.kind is OutcomeKind.SENT:
            fault_point(AFTER_SEND_BEFORE_MARK)
            if not self._unmarked:
                self._unmarked_since = time.monotonic()
            self._unmarked.append((claim, outcome))
            if len(self._unmarked) >= self.mark_batch:
                await self._mark_sent(report, wait=False)
            return
        await self._mark_sent(report)
        decision = self.policy.decide(claim, outcome, self.rng)
        try:
            self._write(claim, decision, outcome)
        except DeliveryLeaseLost as exc:
            report.lost += 1
            log.warning("%s", exc)
            return
        log.info("message %s attempt %d: %s (%s)", claim.message_id[:12], claim.attempt,
                 decision.status.value, decision.error)
        self._tell(claim, decision, outcome, report)

    async def _mark_sent(self, report: DeliveryReport, *, wait: bool = True) -> None:
        """Start committing the buffered sent marks (one group in flight at a time); with
        ``wait``, also wait until every mark is committed and told."""
        sent, self._unmarked = self._unmarked, []
        await self._settle(report)
        if sent:
            assert self._marker is not None
            future = asyncio.get_running_loop().run_in_executor(
                self._marker, self._commit_marks, [(c, o.reply) for c, o in sent])
            self._marking = (sent, future)
        if wait:
            await self._settle(report)

    def _commit_marks(self, sent: list[tuple[MessageClaim, Reply]]) -> list[MessageClaim]:
        """The sent marks, tried once more after a transient ledger error: the connection may
        have dropped after the commit, and a mark recognises its own (unmarked, these accepted
        messages would be sent again once their leases expire)."""
        try:
            return self.ledger.outbox.mark_sent(sent)
        except RunledgerError as exc:
            if not exc.retryable:
                raise
            log.warning("sent marks of %d messages failed (%s); trying once more", len(sent), exc)
            return self.ledger.outbox.mark_sent(sent)

    async def _settle(self, report: DeliveryReport) -> None:
        if self._marking is None:
            return
        sent, future = self._marking
        self._marking = None
        lost = {c.message_id for c in await future}
        for claim, outcome in sent:
            if claim.message_id in lost:
                report.lost += 1
                log.warning("message %s: delivery lease lost before it was marked sent",
                            claim.message_id)
            else:
                self._tell(claim, Decision(Status.SENT), outcome, report)

    def _tell(self, claim: MessageClaim, decision: Decision, outcome: SendOutcome,
              report: DeliveryReport) -> None:
        delivery = Delivery(
            message_id=claim.message_id, run_id=claim.run_id, recipient=claim.recipient,
            attempt=claim.attempt, status=decision.status, delay=decision.delay,
            error=decision.error, reply_code=outcome.reply.code, channel=claim.channel,
            settled=outcome.settled,
        )
        report.add(delivery)
        if self.observer is not None:
            self.observer(delivery)

    def _write(self, claim: MessageClaim, decision: Decision, outcome: SendOutcome) -> None:
        reply, error = outcome.reply, decision.error or outcome.summary
        if decision.status is Status.RETRY:
            self.ledger.outbox.schedule_retry(claim, decision.delay or 0.0, error, reply)
        elif decision.status is Status.UNCERTAIN:
            self.ledger.outbox.mark_uncertain(claim, error, decision.delay, reply)
        else:
            self.ledger.outbox.mark_dead(claim, error, reply)

    def _release(self, claims: Sequence[MessageClaim], report: DeliveryReport) -> None:
        for claim in claims:
            self.ledger.outbox.release_message(claim)
            report.released.add(claim.message_id)
