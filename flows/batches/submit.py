"""Submitting a batch: its intent (key, calls, input digest) committed first, then the file
uploaded and the batch created at the provider, each id stored as soon as it is known. A batch
is created at most once per key: a submitter that finds a batch without a provider id (a worker
died between ``create`` and storing the id, or ``create`` lost its reply) asks the provider for
it before creating it: the batch carrying its key, or, where batches carry no key, the oldest
created since its intent with as many requests that no batch of the ledger names."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from flows.model.batch.protocol import BatchClient, RemoteBatch, Sought
from flows.model.errors import ModelRejected, ModelUnavailable
from store import (
    AFTER_BATCH_CREATE,
    AFTER_BATCH_UPLOAD,
    BatchClaim,
    BatchLine,
    CreateInDoubt,
    LeaseLost,
    Ledger,
    fault_point,
)

log = logging.getLogger(__name__)

BATCH_KEY_PREFIX = "rb-"
# How far the provider's clock may run behind the database's: a batch created this long
# before its intent was committed may still be its.
CLOCK_SKEW = timedelta(minutes=2)


def new_batch_key() -> str:
    """A batch's key: what its provider batch carries in its metadata (``runledger_batch``)."""
    return f"{BATCH_KEY_PREFIX}{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Submitted:
    """A batch at its provider: the ledger's key, the provider's id and status, its calls."""

    key: str
    provider_batch_id: str
    status: str
    requests: int


def submit_queued(ledger: Ledger, client: BatchClient, *, job: str, endpoint: str, model: str,
                  owner: str, lease_seconds: float, flow_run_id: str | None,
                  period_start: datetime | None, deadline_at: datetime | None,
                  queued_before: datetime | None = None,
                  max_tokens: int | None = None) -> list[Submitted]:
    """Open and submit batches of ``job``'s queued calls to ``endpoint`` (those queued before
    ``queued_before``, if given) until none waits (several when they pass the provider's
    requests per batch; with ``max_tokens``, what the endpoint's enqueued-token limit leaves
    room for: the rest waits for a later poll), each with ``deadline_at``."""
    submitted: list[Submitted] = []
    while True:
        opened = ledger.batches.open_batch(
            new_batch_key(), job=job, endpoint=endpoint, model=model, kind=client.kind,
            owner=owner, lease=lease_seconds, max_requests=client.max_requests,
            flow_run_id=flow_run_id, period_start=period_start, deadline_at=deadline_at,
            queued_before=queued_before, max_tokens=max_tokens)
        if opened is None:
            return submitted
        remote = submit(ledger, client, opened.claim, opened.lines, lease_seconds)
        submitted.append(Submitted(opened.claim.key, remote.id, remote.status,
                                   len(opened.lines)))


def submit(ledger: Ledger, client: BatchClient, claim: BatchClaim, lines: list[BatchLine],
           lease_seconds: float) -> RemoteBatch:
    """Create the batch at its provider once, under the batch's lease: a claim that took over
    a batch whose file id was stored adopts the provider's batch it finds before creating one;
    a create whose reply was lost is settled the same way; a holder whose lease ran out while
    it uploaded, or a taker whose lease ran out before it looked, creates nothing
    (``LeaseLost``): the file's id is stored, and the lease extended by ``lease_seconds``,
    before the create. The provider's batch."""
    # A create is only ever sent once the file id is stored: without one, nothing to find.
    remote = None
    if claim.fence > 1 and claim.provider_file_id is not None:
        # A taker extends the lease before looking: no later taker looks (and creates) while
        # this one may still create, and a taker whose lease ran out creates nothing.
        hold_for_create(ledger, claim, claim.provider_file_id, lease_seconds)
        remote = find(ledger, client, claim)
    if remote is None:
        sent = [(line.custom_id, line.request) for line in lines]
        file_id = claim.provider_file_id
        if file_id is None:
            file_id = client.upload(claim.key, sent)
            fault_point(AFTER_BATCH_UPLOAD)  # uploaded, its id not stored
            hold_for_create(ledger, claim, file_id, lease_seconds)
        try:
            remote = client.create(claim.key, file_id, sent)
        except ModelUnavailable:
            # The reply was lost, not necessarily the batch: ask before anything else creates.
            remote = find(ledger, client, claim)
            if remote is None:
                raise
            log.info("batch %s: create lost its reply; the provider has it as %s", claim.key,
                     remote.id)
        except ModelRejected as exc:
            if exc.status is not None:  # refused with a status: no batch was made
                ledger.batches.forget_file(claim)
            raise
        fault_point(AFTER_BATCH_CREATE)  # created, its id not stored
    ledger.batches.record_submitted(claim, remote.id, remote.status)
    return remote


def hold_for_create(ledger: Ledger, claim: BatchClaim, file_id: str,
                    lease_seconds: float) -> None:
    """Store the batch's file id and extend its lease by ``lease_seconds`` before a create:
    ``LeaseLost`` when the lease ran out (the holder that took it creates the batch),
    ``CreateInDoubt`` when another create of the kind is in doubt (the lease given back)."""
    recorded = ledger.batches.record_file(claim, file_id, lease_seconds)
    if recorded == "busy":
        raise CreateInDoubt(f"batch {claim.key}: another {claim.kind} batch's create is in "
                            "doubt; this one is created once that is settled, by the next poll")
    if recorded == "lost":
        raise LeaseLost(f"batch {claim.key}: fence {claim.fence} of {claim.owner} lost its "
                        "lease before its create; the holder that took it creates it")


def find(ledger: Ledger, client: BatchClient, claim: BatchClaim) -> RemoteBatch | None:
    """The provider's batch the claimed batch's create made, if any: the likeliest of those
    the provider offers that no other batch of the ledger names."""
    since = claim.created_at - CLOCK_SKEW
    found = client.find(Sought(claim.key, claim.requests, since))
    named = ledger.batches.submitted_since(since) if found else set()
    return next((remote for remote in found if remote.id not in named), None)
