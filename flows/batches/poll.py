"""Polling batches: whichever process polls next takes each due batch's lease (fenced, by the
database clock), submits a batch whose intent was committed but never created, asks the
provider about a submitted one and, once it ended, settles each result line once, then finishes
the batch: calls without an answer go into a new batch, and the Runs none of whose calls still
waits are released to run again (or failed, when the provider refused a call).

Queued calls no batch holds, left by a tick that died before it opened their batch, are put in
a batch by the poll once they have waited longer than a batch lease (a live tick opens its
batches as soon as its subjects have ended).

A batch's deadline bounds the wait: one still running past it is cancelled (its completed
requests are billed and settled when it ends), and the calls a batch ends without are withdrawn
from batch mode, to be called synchronously, once their deadline is nearer than
``RUNLEDGER_BATCH_MARGIN_SECONDS``: a new batch might not end in time. A batch never created
by then is not created: its calls are withdrawn too. ``runledger batches cancel`` moves a
batch's deadline to now."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from flows.batches.settle import end_of
from flows.batches.submit import Submitted, find, submit, submit_queued
from flows.model import endpoint_named
from flows.model.batch.protocol import BatchClient, RemoteBatch
from flows.prices import PriceList
from flows.settings import RunledgerSettings
from store import (
    MID_RESULTS_DOWNLOAD,
    WITHDRAWN,
    BatchClaim,
    BatchCounts,
    CreateInDoubt,
    End,
    Ledger,
    RunledgerError,
    RunRef,
    TickRef,
    fault_point,
)

log = logging.getLogger(__name__)

SETTLE_CHUNK = 200  # result lines settled per ledger transaction
FAILED = "failed"  # a batch its provider refused as a whole
CANCELLING = "cancelling"
NOT_CREATED = "not created"  # the status of a batch withdrawn before its provider had it
HELD_BACK = "held back"  # another create of its provider is in doubt: the next poll creates it


@dataclass
class Polled:
    """One batch as a poll left it: ``action`` is ``submitted`` (created at the provider now),
    ``waiting`` (still running there), ``cancelling`` (past its deadline: asked to stop now),
    ``settled``, ``held back`` (not created while another create of its provider is in doubt:
    the next poll creates it), ``error`` (the poll failed: its lease runs out and the next
    poll tries again) or ``swept`` (calls a dead tick left, submitted in it now); ``withdrawn``: the
    calls it ended without that go synchronous; ``ticks``: the ticks whose calls it settled."""

    key: str
    job: str
    endpoint: str
    action: str
    provider_batch_id: str | None = None
    provider_status: str | None = None
    flow_run_id: str | None = None
    period_start: datetime | None = None
    settled: int = 0
    requeued: int = 0
    withdrawn: int = 0
    released: list[RunRef] = field(default_factory=list)
    failed: list[RunRef] = field(default_factory=list)
    resubmitted: list[Submitted] = field(default_factory=list)
    error: str | None = None
    ticks: list[TickRef] = field(default_factory=list)


def poll_batches(ledger: Ledger, settings: RunledgerSettings, owner: str, now: datetime,
                 limit: int = 100) -> list[Polled]:
    """Take the due batches' leases and move each on as far as its provider allows, their
    deadlines judged at ``now``; then submit the queued calls dead ticks left."""
    polled: list[Polled] = []
    for claim in ledger.batches.claim_due(owner, settings.batch_lease_seconds, limit):
        try:
            polled.append(poll_one(ledger, settings, owner, claim, now))
        except CreateInDoubt as exc:
            log.info("batch %s: %s", claim.key, exc)
            polled.append(Polled(claim.key, claim.job, claim.endpoint, HELD_BACK, None, None,
                                 claim.flow_run_id, claim.period_start))
        except RunledgerError as exc:
            log.warning("batch %s (%s): %s; the next poll tries again once its lease ends",
                        claim.key, claim.provider_batch_id or "not created", exc)
            polled.append(Polled(claim.key, claim.job, claim.endpoint, "error",
                                 claim.provider_batch_id, None, claim.flow_run_id,
                                 claim.period_start, error=str(exc)))
    return polled + sweep_orphans(ledger, settings, owner, now)


def sweep_orphans(ledger: Ledger, settings: RunledgerSettings, owner: str,
                  now: datetime) -> list[Polled]:
    """Submit the queued calls no batch holds that have waited longer than a batch lease at
    ``now`` (their tick died before opening their batch), their deadline counted from the
    oldest one's queueing."""
    polled: list[Polled] = []
    lease = timedelta(seconds=settings.batch_lease_seconds)
    deadline = timedelta(seconds=settings.batch_deadline_seconds)
    for orphan in ledger.batches.orphaned_queues(now - lease):
        try:
            endpoint = endpoint_named(orphan.endpoint, settings)
            client = endpoint.batch_client()
            try:
                submitted = submit_queued(
                    ledger, client, job=orphan.job, endpoint=orphan.endpoint,
                    model=orphan.model, owner=owner, lease_seconds=settings.batch_lease_seconds,
                    flow_run_id=None, period_start=None, deadline_at=orphan.oldest + deadline,
                    queued_before=now - lease,
                    max_tokens=endpoint.batch_queue_tokens)
            finally:
                client.close()
        except CreateInDoubt as exc:
            log.info("job %s: %s", orphan.job, exc)
            polled.append(Polled("-", orphan.job, orphan.endpoint, HELD_BACK))
            continue
        except RunledgerError as exc:
            log.warning("job %s: could not submit the calls a dead tick queued for endpoint "
                        "%s: %s; the next poll tries again", orphan.job, orphan.endpoint, exc)
            polled.append(Polled("-", orphan.job, orphan.endpoint, "error", error=str(exc)))
            continue
        polled += [Polled(s.key, orphan.job, orphan.endpoint, "swept", s.provider_batch_id,
                          s.status) for s in submitted]
    return polled


def poll_one(ledger: Ledger, settings: RunledgerSettings, owner: str, claim: BatchClaim,
             now: datetime) -> Polled:
    """Move one claimed batch on: submit it, note it still running (cancelled once past its
    deadline at ``now``), or settle it."""
    endpoint = endpoint_named(claim.endpoint, settings)
    client = endpoint.batch_client()
    try:
        if claim.status == "open" or claim.provider_batch_id is None:
            if past_deadline(claim, now + timedelta(seconds=settings.batch_margin_seconds)):
                return withdraw_unsent(ledger, client, claim)
            remote = submit(ledger, client, claim, ledger.batches.lines(claim.key),
                            settings.batch_lease_seconds)
            return Polled(claim.key, claim.job, claim.endpoint, "submitted", remote.id,
                          remote.status, claim.flow_run_id, claim.period_start)
        remote = client.retrieve(claim.provider_batch_id)
        if not remote.ended:
            action = "waiting"
            if past_deadline(claim, now) and remote.status != CANCELLING:
                log.warning("batch %s (%s) still runs past its deadline %s: cancelling it; "
                            "its unfinished calls are called synchronously", claim.key,
                            remote.id, claim.deadline_at)
                remote, action = client.cancel(remote.id), "cancelling"
            ledger.batches.record_polled(
                claim, remote.status, BatchCounts(remote.total, remote.completed, remote.failed))
            return Polled(claim.key, claim.job, claim.endpoint, action, remote.id,
                          remote.status, claim.flow_run_id, claim.period_start)
        if remote.status == FAILED and not remote.transient:
            # The provider refused the batch as a whole (its file did not validate): sending
            # its calls again would fail the same way, so each fails its Run, with the reason.
            # One refused for now (its queue full) settles nothing: its calls are queued
            # again, and a later poll sends them once they waited a lease.
            reason = f"the provider failed batch {remote.id}: {remote.error or 'no reason given'}"
            settled = _settle(ledger, claim, [(line.custom_id, End("failed", error=reason))
                                              for line in ledger.batches.lines(claim.key)])
        else:
            settled = settle_results(ledger, client, claim, remote, endpoint.prices())
        withdrawn = (withdraw_unanswered(ledger, claim, remote)
                     if past_deadline(claim, now + timedelta(seconds=settings.batch_margin_seconds))
                     else 0)
        finished = ledger.batches.finish_batch(claim, remote.status, remote.error)
        again = submit_queued(
            ledger, client, job=claim.job, endpoint=claim.endpoint, model=claim.model,
            owner=owner, lease_seconds=settings.batch_lease_seconds,
            flow_run_id=claim.flow_run_id, period_start=claim.period_start,
            deadline_at=claim.deadline_at, max_tokens=endpoint.batch_queue_tokens
        ) if finished.requeued and not remote.transient else []
        return Polled(claim.key, claim.job, claim.endpoint, "settled", remote.id, remote.status,
                      claim.flow_run_id, claim.period_start, settled, finished.requeued,
                      withdrawn, list(finished.released), list(finished.failed), again,
                      ticks=list(finished.ticks))
    finally:
        client.close()


def past_deadline(claim: BatchClaim, now: datetime) -> bool:
    """Whether the batch's calls have waited for batches as long as they may at ``now``."""
    return claim.deadline_at is not None and now >= claim.deadline_at


def withdraw_unsent(ledger: Ledger, client: BatchClient, claim: BatchClaim) -> Polled:
    """A batch never created whose deadline is near is not created now: one whose create may
    have been sent is looked for at its provider first (found, it is stored, and the next poll
    cancels it); else its calls are withdrawn (never billed) and its Runs released to be
    called synchronously."""
    if claim.provider_file_id is not None:
        remote = find(ledger, client, claim)
        if remote is not None:
            ledger.batches.record_submitted(claim, remote.id, remote.status)
            return Polled(claim.key, claim.job, claim.endpoint, "submitted", remote.id,
                          remote.status, claim.flow_run_id, claim.period_start)
    withdrawn = _withdraw(ledger, claim, f"batch {claim.key} was never created and its "
                          f"deadline {claim.deadline_at} is near: called synchronously")
    finished = ledger.batches.finish_batch(claim, NOT_CREATED)
    return Polled(claim.key, claim.job, claim.endpoint, "settled", None, NOT_CREATED,
                  claim.flow_run_id, claim.period_start, 0, finished.requeued, withdrawn,
                  list(finished.released), list(finished.failed), ticks=list(finished.ticks))


def withdraw_unanswered(ledger: Ledger, claim: BatchClaim, remote: RemoteBatch) -> int:
    """Withdraw the calls the ended batch has no result for from batch mode (not billed,
    their reservations released): their Runs are called synchronously. How many."""
    return _withdraw(ledger, claim, f"batch {remote.id} ended {remote.status} without it and "
                     f"its deadline {claim.deadline_at} is near: called synchronously")


def _withdraw(ledger: Ledger, claim: BatchClaim, reason: str) -> int:
    """Withdraw the batch's calls still queued, each with ``reason``; how many."""
    left = [call.custom_id for call in ledger.batches.calls_of(claim.key)
            if call.outcome == "queued" and call.custom_id is not None]
    return _settle(ledger, claim, [(custom_id, End(WITHDRAWN, error=reason))
                                   for custom_id in left])


def settle_results(ledger: Ledger, client: BatchClient, claim: BatchClaim, remote: RemoteBatch,
                   prices: PriceList) -> int:
    """Settle every result line of an ended batch at the batch price of the endpoint's
    ``prices``, a chunk per transaction; how many settled now (a line settled by an earlier
    poll is not again)."""
    settled = 0
    chunk: list[tuple[str, End]] = []
    for index, line in enumerate(client.results(remote)):
        if index == 1:
            fault_point(MID_RESULTS_DOWNLOAD)  # a line read, none settled
        end = end_of(line, prices, claim.model)
        if end is not None:
            chunk.append((line.custom_id, end))
        if len(chunk) >= SETTLE_CHUNK:
            settled += _settle(ledger, claim, chunk)
            chunk = []
    return settled + _settle(ledger, claim, chunk)


def _settle(ledger: Ledger, claim: BatchClaim, chunk: Sequence[tuple[str, End]]) -> int:
    return len(ledger.batches.settle_results(claim, chunk)) if chunk else 0
