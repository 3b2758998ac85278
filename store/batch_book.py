"""The ledger's provider batches (``Ledger.batches``): each method is one unit of work around
one transition or read of ``store.batches``, a transition followed by its fault point."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from store import batches as bt
from store import faults
from store.batch_tables import Batch
from store.batches import (
    BatchClaim,
    BatchCounts,
    BatchLine,
    FileRecorded,
    FinishedBatch,
    OpenedBatch,
    OrphanedQueue,
    ReleasedRun,
)
from store.call_plan import End
from store.call_tables import ModelCall
from store.errors import LeaseLost
from store.lease import Claim
from store.models import Run
from store.units_of_work import UnitsOfWork
from store.validators import error_text, json_document, lease_seconds


class BatchBook:
    """The batches of queued model calls sent through providers' Batch APIs, their leases,
    results and the Runs that wait for them (``Ledger.batches``)."""

    def __init__(self, ledger: UnitsOfWork) -> None:
        self._ledger = ledger

    def wait_for_batch(self, claim: Claim, note: str) -> None:
        """The Run whose calls this claim queued waits for its batch: never claimed until the
        batch releases it, its attempt given back, its Attempt ended released with ``note``
        (see ``wait_for_batch_txn``); ``LeaseLost`` if this claim no longer holds it."""
        if not self._ledger._write(faults.AFTER_WAIT_FOR_BATCH_COMMIT, bt.wait_for_batch_txn,
                                   claim.run_id, claim.fence, claim.owner, claim.attempt_id,
                                   error_text(note)):
            raise LeaseLost(f"run {claim.run_id}: fence {claim.fence} of {claim.owner} no "
                            "longer holds it; it does not wait for a batch")

    def open_batch(self, key: str, *, job: str, endpoint: str, model: str, kind: str,
                   owner: str, lease: timedelta | float, max_requests: int,
                   flow_run_id: str | None = None, period_start: datetime | None = None,
                   deadline_at: datetime | None = None,
                   queued_before: datetime | None = None,
                   max_tokens: int | None = None) -> OpenedBatch | None:
        """Open the batch ``key`` of the oldest queued calls of ``job`` and ``endpoint`` that no
        batch holds, at most ``max_requests``, its lease held by ``owner``, its calls waiting
        for batches until ``deadline_at`` (only calls queued before ``queued_before``, if
        given; with ``max_tokens``, as many as the endpoint's enqueued-token limit leaves room
        for): its intent, committed before its file is uploaded; None (nothing written) when
        no call waits or none fits."""
        return self._ledger._write(
            faults.AFTER_BATCH_INTENT_COMMIT, bt.open_batch_txn, key, job=job,
            endpoint=endpoint, model=model, kind=kind, owner=owner,
            lease_seconds=lease_seconds(lease), max_requests=max_requests,
            flow_run_id=flow_run_id, period_start=period_start, deadline_at=deadline_at,
            queued_before=queued_before, max_tokens=max_tokens)

    def claim_batch(self, key: str, owner: str, lease: timedelta | float) -> BatchClaim | None:
        """Take the lease of the batch ``key`` if it is in flight and its lease is free or
        expired (database clock); None otherwise."""
        return self._ledger._write(faults.AFTER_CLAIM_BATCH_COMMIT, bt.claim_batch_txn,
                                   key, owner, lease_seconds(lease))

    def claim_due(self, owner: str, lease: timedelta | float, limit: int) -> list[BatchClaim]:
        """Lease up to ``limit`` batches in flight whose lease is free or expired, oldest
        first (see ``claim_due_batches_txn``)."""
        return self._ledger._write(faults.AFTER_CLAIM_BATCH_COMMIT, bt.claim_due_batches_txn,
                                   owner, lease_seconds(lease), limit)

    def lines(self, key: str) -> list[BatchLine]:
        """The lines of the batch's file, in ``custom_id`` order."""
        return self._ledger._read(bt.batch_lines, key)

    def record_file(self, claim: BatchClaim, file_id: str,
                    lease: timedelta | float) -> FileRecorded:
        """Store the file's id, the lease extended by ``lease`` (its holder creates the batch
        next): ``recorded``; ``lost`` when the lease is no longer held; ``busy`` (the lease
        given back) for an ``inline`` file while another create of its kind is in doubt (see
        ``record_file_txn``)."""
        return self._ledger._write(faults.AFTER_BATCH_FILE_COMMIT, bt.record_file_txn,
                                   claim, file_id, lease_seconds(lease))

    def forget_file(self, claim: BatchClaim) -> bool:
        """Clear the file id of a batch its provider refused to create; False when the lease
        is no longer held."""
        return self._ledger._write(faults.AFTER_BATCH_FILE_COMMIT, bt.forget_file_txn, claim)

    def record_submitted(self, claim: BatchClaim, provider_batch_id: str,
                         provider_status: str) -> bool:
        """open -> submitted with the provider's batch id, the lease released; False when the
        lease is no longer held."""
        return self._ledger._write(faults.AFTER_BATCH_SUBMITTED_COMMIT, bt.record_submitted_txn,
                                   claim, provider_batch_id, provider_status)

    def record_polled(self, claim: BatchClaim, provider_status: str,
                      counts: BatchCounts) -> bool:
        """A batch still running: its status and counts noted, the lease released; False when
        the lease is no longer held."""
        return self._ledger._write(faults.AFTER_BATCH_POLLED_COMMIT, bt.record_polled_txn,
                                   claim, provider_status, counts)

    def settle_results(self, claim: BatchClaim,
                       ends: Sequence[tuple[str, End]]) -> list[str]:
        """Settle each result line (custom_id, End) once: its call answered with its
        checkpoint, or refused or failed, its budget reservation settled to the real cost;
        the custom_ids settled now (none under a lost lease)."""
        checked = [(custom_id, End(end.outcome, end.usage,
                                   answer=json_document(end.answer, "model answer",
                                                        self._ledger.max_output_bytes),
                                   error=end.error)
                    if end.outcome == "answered" else end)
                   for custom_id, end in ends]
        return self._ledger._write(faults.AFTER_SETTLE_RESULTS_COMMIT, bt.settle_results_txn,
                                   claim, checked)

    def finish_batch(self, claim: BatchClaim, provider_status: str,
                     error: str | None = None) -> FinishedBatch:
        """Settle the batch: calls without a result queued again, waiting Runs released or
        failed (see ``finish_batch_txn``); ``LeaseLost`` if the lease is no longer held."""
        return self._ledger._write(faults.AFTER_FINISH_BATCH_COMMIT, bt.finish_batch_txn,
                                   claim, provider_status, error)

    def list_batches(self, limit: int = 100, status: str | None = None) -> list[Batch]:
        """The latest batches, newest first, optionally of one status."""
        return self._ledger._read(bt.list_batches, limit, status)

    def get(self, key_or_provider_id: str) -> Batch | None:
        """The batch with this key or provider batch id, if any."""
        return self._ledger._read(bt.get_batch, key_or_provider_id)

    def submitted_since(self, since: datetime) -> set[str]:
        """The provider batch ids of the batches submitted at or after ``since``: the ones a
        batch found without its key may not be."""
        return self._ledger._read(bt.submitted_since, since)

    def calls_of(self, key: str) -> list[ModelCall]:
        """The model calls the batch holds or settled (no answers, no requests)."""
        return self._ledger._read(bt.calls_of_batch, key)

    def waiting_runs(self, job: str | None = None) -> list[Run]:
        """The Runs waiting for a batch, optionally of one job, oldest period first."""
        return self._ledger._read(bt.waiting_runs, job)

    def orphaned_queues(self, queued_before: datetime) -> list[OrphanedQueue]:
        """The jobs and endpoints with queued calls no batch holds, queued before
        ``queued_before`` (their tick died before it opened their batch)."""
        return self._ledger._read(bt.orphaned_queues, queued_before)

    def unsettled_flow_runs(self) -> set[str]:
        """The flow runs of the ticks a queued call of which still waits."""
        return self._ledger._read(bt.unsettled_flow_runs)

    def released_runs(self, limit: int = 1000) -> list[ReleasedRun]:
        """The pending Runs a settled batch released and nothing ran again yet, each saying
        whether it runs again synchronously (a call of its withdrawn from batch mode)."""
        return self._ledger._read(bt.released_runs, limit)
