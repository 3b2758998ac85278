"""Polling batches: whichever process polls next takes each due batch's lease (fenced, by the
database clock), submits a batch whose intent was committed but never created, asks the
provider about a submitted one and, once it ended, settles each result line once, then finishes
the batch: calls without an answer go into a new batch, and the Runs none of whose calls still
waits are released to run again (or failed, when the provider refused a call)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from flows.batches.settle import end_of
from flows.batches.submit import Submitted, submit, submit_queued
from flows.model import endpoint_named
from flows.model.batch.protocol import BatchClient, RemoteBatch
from flows.prices import PriceList
from flows.settings import RunledgerSettings
from store import (
    MID_RESULTS_DOWNLOAD,
    BatchClaim,
    BatchCounts,
    End,
    Ledger,
    RunledgerError,
    RunRef,
    fault_point,
)

log = logging.getLogger(__name__)

SETTLE_CHUNK = 200  # result lines settled per ledger transaction
FAILED = "failed"  # a batch its provider refused as a whole


@dataclass
class Polled:
    """One batch as a poll left it: ``action`` is ``submitted`` (created at the provider now),
    ``waiting`` (still running there), ``settled`` or ``error`` (the poll failed: its lease
    runs out and the next poll tries again)."""

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
    released: list[RunRef] = field(default_factory=list)
    failed: list[RunRef] = field(default_factory=list)
    resubmitted: list[Submitted] = field(default_factory=list)
    error: str | None = None


def poll_batches(ledger: Ledger, settings: RunledgerSettings, owner: str,
                 limit: int = 100) -> list[Polled]:
    """Take the due batches' leases and move each on as far as its provider allows."""
    polled: list[Polled] = []
    for claim in ledger.batches.claim_due(owner, settings.batch_lease_seconds, limit):
        try:
            polled.append(poll_one(ledger, settings, owner, claim))
        except RunledgerError as exc:
            log.warning("batch %s (%s): %s; the next poll tries again once its lease ends",
                        claim.key, claim.provider_batch_id or "not created", exc)
            polled.append(Polled(claim.key, claim.job, claim.endpoint, "error",
                                 claim.provider_batch_id, None, claim.flow_run_id,
                                 claim.period_start, error=str(exc)))
    return polled


def poll_one(ledger: Ledger, settings: RunledgerSettings, owner: str,
             claim: BatchClaim) -> Polled:
    """Move one claimed batch on: submit it, note it still running, or settle it."""
    endpoint = endpoint_named(claim.endpoint, settings)
    client = endpoint.batch_client()
    try:
        if claim.status == "open" or claim.provider_batch_id is None:
            remote = submit(ledger, client, claim, ledger.batches.lines(claim.key))
            return Polled(claim.key, claim.job, claim.endpoint, "submitted", remote.id,
                          remote.status, claim.flow_run_id, claim.period_start)
        remote = client.retrieve(claim.provider_batch_id)
        if not remote.ended:
            ledger.batches.record_polled(
                claim, remote.status, BatchCounts(remote.total, remote.completed, remote.failed))
            return Polled(claim.key, claim.job, claim.endpoint, "waiting", remote.id,
                          remote.status, claim.flow_run_id, claim.period_start)
        if remote.status == FAILED:
            # The provider refused the batch as a whole (its file did not validate): sending
            # its calls again would fail the same way, so each fails its Run, with the reason.
            reason = f"the provider failed batch {remote.id}: {remote.error or 'no reason given'}"
            settled = _settle(ledger, claim, [(line.custom_id, End("failed", error=reason))
                                              for line in ledger.batches.lines(claim.key)])
        else:
            settled = settle_results(ledger, client, claim, remote, endpoint.prices())
        finished = ledger.batches.finish_batch(claim, remote.status, remote.error)
        again = submit_queued(
            ledger, client, job=claim.job, endpoint=claim.endpoint, model=claim.model,
            owner=owner, lease_seconds=settings.batch_lease_seconds,
            flow_run_id=claim.flow_run_id, period_start=claim.period_start
        ) if finished.requeued else []
        return Polled(claim.key, claim.job, claim.endpoint, "settled", remote.id, remote.status,
                      claim.flow_run_id, claim.period_start, settled, finished.requeued, list(finished.released),
                      list(finished.failed), again)
    finally:
        client.close()


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
