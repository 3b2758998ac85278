"""OpenAI's Batch API (``/v1/files`` and ``/v1/batches``) on the official ``openai`` SDK, for
chat completions at half price: a JSONL file of lines ``{"custom_id", "method": "POST", "url":
"/v1/chat/completions", "body"}`` uploaded (purpose ``batch``), a batch created of it with our
key in its metadata (``runledger_batch``), polled, its output and error files read.

It shares the synchronous client (``OpenAICompatibleModel``, composed): the same address, key
and never-retrying SDK client, the same request body for a line as for a call, the same
answer parsing for a result line as for an answer, the same failures (``ModelUnavailable``:
no answer, no connection, 408, 429, 5xx; ``ModelRejected``: other 4xx, a malformed reply).
A result line is classified as the synchronous answer would be: a 200 line is an answer (a
refusal by the model kept in ``Generation.refusal``), a 408/429/5xx line a transient error,
another 4xx line a permanent one; an error file line naming a code (a request the batch
ended before it ran: ``batch_expired``, ``batch_cancelled``) is transient."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

import openai
from openai.types import Batch
from openai.types.chat import ChatCompletion
from pydantic import SecretStr

from flows.model.batch.protocol import BATCH_KEY, RemoteBatch, ResultLine, Sought, quoted
from flows.model.client import Kind
from flows.model.errors import InvalidModelRequest, ModelMisconfigured, ModelRejected
from flows.model.openai_compatible import (
    OpenAICompatibleModel,
    generation_of,
    transient_status,
)
from flows.model.request import Request

URL: Final = "/v1/chat/completions"  # every line's, and the batch's endpoint
WINDOW: Final = "24h"  # the only completion window OpenAI offers
MAX_REQUESTS = 50_000  # the most lines OpenAI takes in one batch file
PAGE = 100  # batches per page when looking one up (OpenAI's most)
ENDED = frozenset({"completed", "expired", "cancelled", "failed"})
# Error codes of a line the batch never ran (it expired or was cancelled first), or that the
# provider could not run for now: asking again in another batch may succeed.
TRANSIENT_CODES = frozenset({"batch_expired", "batch_cancelled", "rate_limit_exceeded",
                             "server_error"})
# Why a batch may fail as a whole for now only: the model's queue of enqueued tokens was full.
TRANSIENT_BATCH_CODES = frozenset({"token_limit_exceeded"})


def _remote(batch: Batch) -> RemoteBatch:
    counts = batch.request_counts
    errors = batch.errors.data if batch.errors is not None and batch.errors.data else []
    error = "; ".join(
        f"{e.code or 'error'}: {e.message or ''}" + (f" (line {e.line})" if e.line else "")
        for e in errors) or None
    return RemoteBatch(
        batch.id, batch.status, batch.status in ENDED, batch.output_file_id,
        batch.error_file_id, counts.total if counts else 0, counts.completed if counts else 0,
        counts.failed if counts else 0, dict(batch.metadata or {}), error,
        bool(errors) and all(e.code in TRANSIENT_BATCH_CODES for e in errors))


class OpenAIBatchClient:
    """A ``BatchClient`` for an OpenAI (or OpenAI-compatible) endpoint: ``base_url`` and the
    model ``name`` as the synchronous client takes them (its ``temperature`` and
    ``max_tokens`` in every line unless the request sets its own); ``max_requests`` lines at
    most per batch (OpenAI takes 50,000)."""

    kind: Kind = "openai"

    def __init__(
        self,
        base_url: str,
        name: str,
        api_key: SecretStr | None = None,
        *,
        timeout_seconds: float = 60.0,
        temperature: float | None = None,
        max_tokens: int = 1024,
        max_requests: int = MAX_REQUESTS,
    ) -> None:
        if not 1 <= max_requests <= MAX_REQUESTS:
            raise ModelMisconfigured(
                f"an OpenAI batch takes 1 to {MAX_REQUESTS} requests, got {max_requests}")
        self.model = OpenAICompatibleModel(
            base_url, name, api_key, timeout_seconds=timeout_seconds, temperature=temperature,
            max_tokens=max_tokens)
        self.name = name
        self.base_url = self.model.base_url
        self.endpoint = self.model.endpoint
        self.max_tokens = max_tokens
        self.max_requests = max_requests

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r}, name={self.name!r})"

    @contextmanager
    def _asking(self, doing: str) -> Iterator[None]:
        """The synchronous client's failures, naming what was being done; a reply the SDK
        cannot read is refused as malformed."""
        with self.model.asking(doing):
            try:
                yield
            except openai.APIResponseValidationError as exc:
                raise ModelRejected(
                    f"model {self.name} at {self.base_url} ({doing}) sent a malformed reply: "
                    f"{quoted(str(exc))}") from exc

    def line(self, request: Request) -> dict[str, Any]:
        """The body of ``request``'s batch line: what ``complete`` would send."""
        return self.model.body(request)

    def find(self, sought: Sought) -> list[RemoteBatch]:
        """The newest batch whose metadata names the sought key (``batches.list``, every page
        until found), or none."""
        with self._asking(f"batches.list looking for batch {sought.key}"):
            for batch in self.model.sdk.batches.list(limit=PAGE,
                                                     extra_headers=self.model.headers):
                if (batch.metadata or {}).get(BATCH_KEY) == sought.key:
                    return [_remote(batch)]
        return []

    def upload(self, key: str, lines: Sequence[tuple[str, dict[str, Any]]]) -> str:
        """Upload the JSONL file of ``lines`` (custom_id, body) for batch ``key``; its file
        id. No lines, more than ``max_requests`` or a custom_id twice is refused before
        anything is sent (``InvalidModelRequest``)."""
        ids = [custom_id for custom_id, _ in lines]
        if not 1 <= len(ids) <= self.max_requests:
            raise InvalidModelRequest(
                f"batch {key} must have 1 to {self.max_requests} lines, got {len(ids)}")
        if len(set(ids)) != len(ids):
            raise InvalidModelRequest(f"batch {key} names a custom_id twice")
        data = b"".join(
            json.dumps({"custom_id": custom_id, "method": "POST", "url": URL, "body": body},
                       separators=(",", ":")).encode() + b"\n"
            for custom_id, body in lines)
        with self._asking(f"files.create of batch {key}'s input file"):
            uploaded = self.model.sdk.files.create(
                file=(f"runledger-{key}.jsonl", data, "application/jsonl"), purpose="batch",
                extra_headers=self.model.headers)
        return uploaded.id

    def create(self, key: str, file_id: str,
               lines: Sequence[tuple[str, dict[str, Any]]]) -> RemoteBatch:
        """Create the batch of ``file_id`` under ``key`` (in its metadata); ``lines`` are in
        the file already."""
        with self._asking(f"batches.create of batch {key}"):
            batch = self.model.sdk.batches.create(
                input_file_id=file_id, endpoint=URL, completion_window=WINDOW,
                metadata={BATCH_KEY: key}, extra_headers=self.model.headers)
        return _remote(batch)

    def retrieve(self, batch_id: str) -> RemoteBatch:
        """The batch as OpenAI reports it now."""
        with self._asking(f"batches.retrieve of {batch_id}"):
            batch = self.model.sdk.batches.retrieve(batch_id, extra_headers=self.model.headers)
        return _remote(batch)

    def cancel(self, batch_id: str) -> RemoteBatch:
        """Ask OpenAI to cancel the batch (``cancelling``, then ``cancelled`` with the results
        done so far)."""
        with self._asking(f"batches.cancel of {batch_id}"):
            batch = self.model.sdk.batches.cancel(batch_id, extra_headers=self.model.headers)
        return _remote(batch)

    def results(self, batch: RemoteBatch) -> Iterator[ResultLine]:
        """The lines of the batch's output file, then of its error file (either may be
        missing: a batch whose every line failed has no output file). A file line that
        cannot be read (not JSON, no custom_id) is refused as malformed (``ModelRejected``)."""
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id is None:
                continue
            doing = f"files.content of {file_id} of batch {batch.id}"
            with self._asking(doing):
                content = self.model.sdk.files.content(
                    file_id, extra_headers=self.model.headers).content
            for number, raw in enumerate(content.splitlines(), 1):
                if raw.strip():
                    yield self._result(raw, f"{doing}, line {number}")

    def _result(self, raw: bytes, where: str) -> ResultLine:
        try:
            found = json.loads(raw)
        except ValueError as exc:
            raise ModelRejected(f"model {self.name} at {self.base_url} ({where}) sent a "
                                f"line that is not JSON: {exc}") from exc
        custom_id = found.get("custom_id") if isinstance(found, dict) else None
        if not isinstance(custom_id, str):
            raise ModelRejected(f"model {self.name} at {self.base_url} ({where}) sent a "
                                f"line without a custom_id: {quoted(raw.decode(errors='replace'))}")
        response, error = found.get("response"), found.get("error")
        if isinstance(response, dict):
            return self._response(custom_id, response)
        if isinstance(error, dict):
            code = error.get("code")
            return ResultLine(
                custom_id, None, f"model {self.name} did not answer line {custom_id}: "
                f"{code}: {quoted(error.get('message') or '')}", None, code in TRANSIENT_CODES)
        return ResultLine(custom_id, None, f"model {self.name} sent line {custom_id} with "
                          "neither a response nor an error")

    def _response(self, custom_id: str, response: dict[str, Any]) -> ResultLine:
        """A line's response: an answer (status 200), or the error status it carries."""
        status, body = response.get("status_code"), response.get("body")
        if not isinstance(status, int):
            return ResultLine(custom_id, None, f"model {self.name} sent line {custom_id} "
                              f"without a status code: {quoted(response)}")
        if status != 200:
            error = body.get("error") if isinstance(body, dict) else None
            message = error.get("message") if isinstance(error, dict) else None
            return ResultLine(
                custom_id, None, f"model {self.name} answered line {custom_id} with HTTP "
                f"{status}: {quoted(message or body)}", status, transient_status(status))
        try:
            if not isinstance(body, dict):
                raise TypeError(f"a body of type {type(body).__name__}")
            # As the synchronous client reads an answer: built as it is, not validated.
            completion = ChatCompletion.construct(**body)
            return ResultLine(custom_id, generation_of(completion, self.name), None, status)
        except (ModelRejected, AttributeError, TypeError, IndexError) as exc:
            return ResultLine(custom_id, None, f"model {self.name} answered line {custom_id} "
                              f"with a malformed chat completion: {quoted(str(exc))}", status)

    def close(self) -> None:
        self.model.close()
