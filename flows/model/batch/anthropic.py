"""Anthropic's Message Batches API (``/v1/messages/batches``) on the official ``anthropic``
SDK, for messages at half price: a batch is created with its requests in the create itself
(``{"custom_id", "params"}``: no file is uploaded), polled, its results read from its
``results_url`` once it ended, cancelled.

It shares the synchronous client (``AnthropicModel``, composed): the same address, key and
never-retrying SDK client, the same request body for a batch request's ``params`` as for a
call, the same answer reading for a succeeded result as for a message, the same failures.

Anthropic's batches carry no metadata, so a batch whose create lost its reply cannot be found
by its key: ``find`` offers the batches created since the intent with as many requests,
oldest first, and the submitter takes the first no other batch of the ledger names. Its
words map onto the ledger's: ``in_progress``; ``canceling`` is ``cancelling``; an ``ended``
batch is ``cancelled`` when a cancel was asked, ``expired`` when a request expired, else
``completed``. A result line ``succeeded`` is an answer (a refusal by the model kept in
``Generation.refusal``); ``errored`` carries an error type, transient or not as its HTTP
status would be; ``canceled`` and ``expired`` lines never ran: asking again may succeed."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Final, cast

from anthropic.resources.messages.batches import Batches
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from anthropic.types.messages import (
    MessageBatch,
    MessageBatchErroredResult,
    MessageBatchIndividualResponse,
    MessageBatchSucceededResult,
)
from pydantic import SecretStr

from flows.model.anthropic.client import AnthropicModel, generation_of
from flows.model.anthropic.refusals import STATUS_OF_TYPE, transient
from flows.model.batch.protocol import INLINE, RemoteBatch, ResultLine, Sought, quoted
from flows.model.client import Kind
from flows.model.errors import InvalidModelRequest, ModelMisconfigured, ModelRejected
from flows.model.request import Request

MAX_REQUESTS: Final = 100_000  # the most requests Anthropic takes in one batch
PAGE: Final = 100  # batches per page when looking one up


def status_of(batch: MessageBatch) -> str:
    """The batch's status in the ledger's words."""
    counts = batch.request_counts
    if batch.processing_status == "canceling":
        return "cancelling"
    if batch.processing_status != "ended":
        return batch.processing_status
    if batch.cancel_initiated_at is not None:
        return "cancelled"
    return "expired" if counts.expired else "completed"


def _remote(batch: MessageBatch) -> RemoteBatch:
    counts = batch.request_counts
    total = (counts.processing + counts.succeeded + counts.errored + counts.canceled
             + counts.expired)
    ended = batch.processing_status == "ended"
    return RemoteBatch(batch.id, status_of(batch), ended,
                       batch.results_url if ended else None, None, total, counts.succeeded,
                       counts.errored)


class AnthropicBatchClient:
    """A ``BatchClient`` for an Anthropic endpoint: ``base_url`` and the model ``name`` as the
    synchronous client takes them (its ``max_tokens`` in every request unless the request
    sets its own); ``max_requests`` requests at most per batch (Anthropic takes 100,000)."""

    kind: Kind = "anthropic"

    def __init__(
        self,
        base_url: str,
        name: str,
        api_key: SecretStr | None = None,
        *,
        timeout_seconds: float = 60.0,
        max_tokens: int = 1024,
        max_requests: int = MAX_REQUESTS,
    ) -> None:
        if not 1 <= max_requests <= MAX_REQUESTS:
            raise ModelMisconfigured(
                f"an Anthropic batch takes 1 to {MAX_REQUESTS} requests, got {max_requests}")
        self.model = AnthropicModel(base_url, name, api_key, timeout_seconds=timeout_seconds,
                                    max_tokens=max_tokens)
        self.name = name
        self.base_url = self.model.base_url
        self.endpoint = self.model.endpoint
        self.max_requests = max_requests

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r}, name={self.name!r})"

    @property
    def _batches(self) -> Batches:
        return self.model.sdk.messages.batches

    def line(self, request: Request) -> dict[str, Any]:
        """The ``params`` of ``request``'s batch request: what ``complete`` would send."""
        return self.model.params(request)

    def find(self, sought: Sought) -> list[RemoteBatch]:
        """The batches created since the sought one's intent with as many requests, oldest
        first (``batches.list`` is newest first: its pages are read until one is older)."""
        found: list[RemoteBatch] = []
        with self.model.asking(f"messages.batches.list looking for batch {sought.key}"):
            for batch in self._batches.list(limit=PAGE, extra_headers=self.model.headers):
                if batch.created_at < sought.since:
                    break
                remote = _remote(batch)
                if remote.total == sought.requests:
                    found.append(remote)
        return found[::-1]

    def upload(self, key: str, lines: Sequence[tuple[str, dict[str, Any]]]) -> str:
        """Nothing to upload: the requests go with the create (``INLINE``). No lines, more
        than ``max_requests`` or a custom_id twice is refused before anything is sent
        (``InvalidModelRequest``)."""
        ids = [custom_id for custom_id, _ in lines]
        if not 1 <= len(ids) <= self.max_requests:
            raise InvalidModelRequest(
                f"batch {key} must have 1 to {self.max_requests} requests, got {len(ids)}")
        if len(set(ids)) != len(ids):
            raise InvalidModelRequest(f"batch {key} names a custom_id twice")
        return INLINE

    def create(self, key: str, file_id: str,
               lines: Sequence[tuple[str, dict[str, Any]]]) -> RemoteBatch:
        """Create the batch of ``lines`` (custom_id, params); ``file_id`` is ``INLINE``."""
        self.upload(key, lines)
        with self.model.asking(f"messages.batches.create of batch {key}"):
            batch = self._batches.create(
                requests=[{"custom_id": custom_id,
                           "params": cast("MessageCreateParamsNonStreaming", params)}
                          for custom_id, params in lines],
                extra_headers=self.model.headers)
        return _remote(batch)

    def retrieve(self, batch_id: str) -> RemoteBatch:
        """The batch as Anthropic reports it now."""
        with self.model.asking(f"messages.batches.retrieve of {batch_id}"):
            batch = self._batches.retrieve(batch_id, extra_headers=self.model.headers)
        return _remote(batch)

    def cancel(self, batch_id: str) -> RemoteBatch:
        """Ask Anthropic to cancel the batch (``canceling``, then ended with the results done
        so far, the rest ``canceled``)."""
        with self.model.asking(f"messages.batches.cancel of {batch_id}"):
            batch = self._batches.cancel(batch_id, extra_headers=self.model.headers)
        return _remote(batch)

    def results(self, batch: RemoteBatch) -> Iterator[ResultLine]:
        """The result lines of the ended batch (from its ``results_url``); a line that cannot
        be read is refused as malformed (``ModelRejected``)."""
        doing = f"messages.batches.results of {batch.id}"
        with self.model.asking(doing):
            decoder = self._batches.results(batch.id, extra_headers=self.model.headers)
            for number, found in enumerate(decoder, 1):
                yield self._result(found, f"{doing}, line {number}")

    def _result(self, found: MessageBatchIndividualResponse, where: str) -> ResultLine:
        custom_id, result = getattr(found, "custom_id", None), getattr(found, "result", None)
        if not isinstance(custom_id, str):
            raise ModelRejected(f"model {self.name} at {self.base_url} ({where}) sent a "
                                "line without a custom_id")
        if isinstance(result, MessageBatchSucceededResult):
            try:
                structured = any(block.type == "tool_use" for block in result.message.content)
                generation = generation_of(result.message, self.name, structured=structured)
            except (ModelRejected, AttributeError, TypeError) as exc:
                return ResultLine(custom_id, None, f"model {self.name} answered request "
                                  f"{custom_id} with a malformed message: {quoted(str(exc))}",
                                  200)
            return ResultLine(custom_id, generation, None, 200)
        if isinstance(result, MessageBatchErroredResult):
            error = getattr(result.error, "error", None)
            kind = str(getattr(error, "type", None) or "api_error")
            status = STATUS_OF_TYPE.get(kind, 500)
            return ResultLine(
                custom_id, None, f"model {self.name} answered request {custom_id} with "
                f"{kind}: {quoted(getattr(error, 'message', None) or '')}", status,
                transient(status))
        ended = getattr(result, "type", None)
        if ended in ("canceled", "expired"):
            return ResultLine(custom_id, None, f"model {self.name} did not run request "
                              f"{custom_id}: the batch {ended} first", None, True)
        return ResultLine(custom_id, None, f"model {self.name} sent request {custom_id}'s "
                          f"result of an unknown type {ended!r}")

    def close(self) -> None:
        self.model.close()
