"""What a provider's Batch API offers the batch mode: lines built from model requests, a file
of them uploaded (or, for a provider without files, the lines sent with the create), a batch
created under our key, found again after a create that got no reply rather than created
twice, polled, its results read line by line, cancelled. One client per endpoint; ``kind``
names the provider's API."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from flows.model.client import Kind
from flows.model.protocol import Generation
from flows.model.request import Request

# The metadata key naming our batch key on the provider's batch (what ``find`` matches).
BATCH_KEY = "runledger_batch"
# The file id of a batch whose provider takes its lines with the create (no file uploaded).
INLINE = "inline"
MAX_QUOTED = 300  # characters of a provider's words quoted in a result line's error


def quoted(value: Any) -> str:
    """A provider's words (text, or JSON of anything else) as one line of at most
    MAX_QUOTED characters."""
    text = (value if isinstance(value, str) else json.dumps(value)).strip().replace("\n", " ")
    return text[:MAX_QUOTED] + ("..." if len(text) > MAX_QUOTED else "")


@dataclass(frozen=True)
class Sought:
    """A batch whose create may have reached its provider without its id reaching the ledger:
    its ``key``, how many ``requests`` it holds and when its intent was committed (``since``:
    no create of it can be older)."""

    key: str
    requests: int
    since: datetime


@dataclass(frozen=True)
class RemoteBatch:
    """A batch as its provider last reported it: its id and status (OpenAI's words:
    ``validating``, ``in_progress``, ``finalizing``, ``cancelling``, and once ended
    ``completed``, ``expired``, ``cancelled`` or ``failed``; another provider's are mapped to
    them),
    ``ended`` once no more results will come (completed, expired, cancelled or failed), the
    files of its results and of its failed lines (None until there are), its request counts
    (0 when the provider reports none), its metadata and, for a batch that failed as a whole,
    the provider's reasons (``error``) and whether they may pass (``transient``: its queue of
    enqueued tokens was full)."""

    id: str
    status: str
    ended: bool
    output_file_id: str | None
    error_file_id: str | None
    total: int
    completed: int
    failed: int
    metadata: Mapping[str, str] = field(default_factory=dict)
    error: str | None = None
    transient: bool = False

    @property
    def key(self) -> str | None:
        """The batch key we created it under (None: a batch we did not create)."""
        return self.metadata.get(BATCH_KEY)


@dataclass(frozen=True)
class ResultLine:
    """One request's result in an ended batch: its ``generation`` (a refusal by the model is
    an answer: ``Generation.refusal``), or its ``error`` with the HTTP ``status`` the line
    carried (None when the line names an error code, not a response) and whether asking again
    may succeed (``transient``: 408, 429, 5xx, a request the batch ended before it ran)."""

    custom_id: str
    generation: Generation | None
    error: str | None = None
    status: int | None = None
    transient: bool = False


class BatchClient(Protocol):
    """A provider's Batch API for one endpoint (``endpoint`` as model call records name it;
    ``max_requests`` the most lines one batch takes). Failures raise ``ModelUnavailable``
    (transient: ask again later) or ``ModelRejected`` (permanent), naming the provider and
    what failed."""

    kind: Kind
    endpoint: str
    max_requests: int

    def line(self, request: Request) -> dict[str, Any]:
        """The body a batch line sends for ``request`` (what the ledger keeps as the queued
        call's request), as the synchronous client would send it."""
        ...

    def find(self, sought: Sought) -> list[RemoteBatch]:
        """The provider's batches that may be ``sought``'s, likeliest first: the one carrying
        its key where batches carry metadata; else those created since its intent with as
        many requests (the caller drops those another batch of the ledger names)."""
        ...

    def upload(self, key: str, lines: Sequence[tuple[str, dict[str, Any]]]) -> str:
        """Upload the batch file of ``lines`` (custom_id, body) for batch ``key``; its id (a
        provider that takes the lines with the create uploads nothing: ``INLINE``)."""
        ...

    def create(self, key: str, file_id: str,
               lines: Sequence[tuple[str, dict[str, Any]]]) -> RemoteBatch:
        """Create the batch of the uploaded file ``file_id`` (or of ``lines``, for a provider
        without files) under ``key``."""
        ...

    def retrieve(self, batch_id: str) -> RemoteBatch:
        """The batch as the provider reports it now."""
        ...

    def results(self, batch: RemoteBatch) -> Iterator[ResultLine]:
        """The result lines of an ended batch (a request without a line got no result)."""
        ...

    def cancel(self, batch_id: str) -> RemoteBatch:
        """Ask the provider to cancel the batch; it ends ``cancelled`` with what was done."""
        ...

    def close(self) -> None:
        """Release connections; the client is not used afterwards."""
        ...
