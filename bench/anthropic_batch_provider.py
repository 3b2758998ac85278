"""Anthropic's Message Batches API on loopback, as the official SDK calls it
(``client.messages.batches``), for the tests of batch mode against Anthropic: a batch created
of its requests (validated as Anthropic does: 1 to 100,000 of them, custom_ids unique and of
``[a-zA-Z0-9_-]{1,64}``), polled (``polls_until_done`` retrieves answer ``in_progress`` first,
each a share of the requests further), listed newest first by pages, cancelled; its results
as JSONL in Anthropic's shape (``succeeded``, ``errored``, ``canceled``, ``expired``); and
``POST /v1/messages``, answered at once. Each request (and each synchronous call) is answered
by ``message(params)`` (a Messages API message: ``answer N``, or the forced tool's call)
unless ``line_errors`` names its custom_id."""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

from bench.loopback import Answer, LoopbackServer, Request, json_answer
from bench.structured import document

INPUT_TOKENS, OUTPUT_TOKENS = 100, 20
MAX_REQUESTS = 100_000
CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}


def rfc3339(moment: datetime | None) -> str | None:
    """``moment`` as Anthropic writes its times: RFC 3339 in UTC with microseconds and a Z."""
    return None if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Batch:
    """A message batch and how far it went: ``polls`` retrieves so far, ``done`` requests run
    (the first ones); its results (one per request, in order) once it ended."""

    id: str
    requests: list[dict[str, Any]]
    created_at: datetime
    processing_status: str = "in_progress"
    polls: int = 0
    done: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    results: list[dict[str, Any]] = field(default_factory=list)
    ended_at: datetime | None = None
    cancel_initiated_at: datetime | None = None
    results_url: str | None = None

    def view(self) -> dict[str, Any]:
        counts = {kind: self.counts[kind] for kind in (
            "succeeded", "errored", "canceled", "expired")}
        return {
            "id": self.id, "type": "message_batch",
            "processing_status": self.processing_status,
            "request_counts": {"processing": len(self.requests) - sum(counts.values()),
                               **counts},
            "ended_at": rfc3339(self.ended_at), "created_at": rfc3339(self.created_at),
            "expires_at": rfc3339(self.created_at + timedelta(hours=24)),
            "cancel_initiated_at": rfc3339(self.cancel_initiated_at), "archived_at": None,
            "results_url": self.results_url,
        }


def _error(status: int, message: str) -> Answer:
    return json_answer(status, {"type": "error", "error": {
        "type": ERROR_TYPES.get(status, "api_error"), "message": message}})


def _missing(params: Any, where: str) -> str | None:
    """What a Messages API create body lacks, as Anthropic words it; None when it has it all."""
    if not isinstance(params, dict):
        return f"{where}: Input should be a valid dictionary"
    for name in ("model", "max_tokens", "messages"):
        if name not in params:
            return f"{where}.{name}: Field required"
    return None


class AnthropicBatchServer(LoopbackServer):
    """Anthropic's Message Batches API on loopback. Knobs: ``polls_until_done`` (retrieves
    answered ``in_progress`` before the batch ends; 0: ended when created), ``expire_after``
    (the batch ends with only that many requests run, the rest ``expired``), ``line_errors``
    (custom_id -> (HTTP status, message): that request ``errored`` with the error type of that
    status), ``drop_after_create`` (the next N creates create the batch, then close the
    connection without a reply), ``refuse_creates`` (the next N creates are answered with
    ``(status, message)`` and create nothing: (400, ...) a refusal, (500, ...) an outage),
    ``message`` (a request's params -> its message). What it saw:
    ``creates_by_requests`` (creates per set of custom_ids, dropped ones included), ``created``
    (batch ids, oldest first), ``requests`` (method and path)."""

    def __init__(self) -> None:
        super().__init__()
        self.polls_until_done = 0
        self.expire_after: int | None = None
        self.line_errors: dict[str, tuple[int, str]] = {}
        self.drop_after_create = 0
        self.refuse_creates: list[tuple[int, str]] = []
        self.message: Callable[[dict[str, Any]], dict[str, Any]] = self.assistant_message
        self.creates_by_requests: Counter[frozenset[str]] = Counter()
        self.created: list[str] = []
        self.requests: list[tuple[str, str]] = []
        self.batches: dict[str, Batch] = {}
        self._ids = itertools.count(1)
        self._answers = itertools.count(1)
        self._lock = threading.RLock()

    @property
    def base_url(self) -> str:
        return self.origin

    def assistant_message(self, params: dict[str, Any]) -> dict[str, Any]:
        """The message Anthropic answers ``params`` with: ``answer N`` (N counts the answers),
        or, when ``tool_choice`` forces a tool, its call with an input of the tool's schema
        whose text fields are ``answer N``; 100 input and 20 output tokens; the params' model."""
        number = next(self._answers)
        choice = params.get("tool_choice") or {}
        tool = next((t for t in params.get("tools") or []
                     if choice.get("type") == "tool" and t.get("name") == choice.get("name")),
                    None)
        content: dict[str, Any] = {"type": "text", "text": f"answer {number}"}
        if tool is not None:
            content = {"type": "tool_use", "id": f"toolu_{number}", "name": tool["name"],
                       "input": document(tool.get("input_schema", {}), f"answer {number}")}
        return {
            "id": f"msg_{number}", "type": "message", "role": "assistant",
            "model": params.get("model"), "content": [content],
            "stop_reason": "end_turn" if tool is None else "tool_use", "stop_sequence": None,
            "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }

    # --- requests ---------------------------------------------------------------------------

    def answer(self, request: Request) -> Answer:
        url = urlsplit(request.path)
        parts = url.path.strip("/").split("/")
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        with self._lock:
            self.requests.append((request.method, url.path))
            match request.method, parts:
                case "POST", ["v1", "messages", "batches"]:
                    return self._create(request.body)
                case "GET", ["v1", "messages", "batches"]:
                    return self._list(query)
                case "GET", ["v1", "messages", "batches", batch_id]:
                    return self._retrieve(batch_id)
                case "POST", ["v1", "messages", "batches", batch_id, "cancel"]:
                    return self._cancel(batch_id)
                case "GET", ["v1", "messages", "batches", batch_id, "results"]:
                    return self._results(batch_id)
                case "POST", ["v1", "messages"]:
                    # The synchronous API beside it, with the same answers and token counts:
                    # what a benchmark compares the batch price with.
                    params = self._json(request.body)
                    wrong = _missing(params, "body")
                    if wrong is not None:
                        return _error(400, wrong)
                    return json_answer(200, self.message(params))
            return _error(404, f"no route {request.method} {url.path}")

    @staticmethod
    def _json(body: bytes) -> Any:
        try:
            return json.loads(body)
        except ValueError:
            return None

    def _create(self, body: bytes) -> Answer:
        asked = self._json(body)
        requests = asked.get("requests") if isinstance(asked, dict) else None
        if not isinstance(requests, list) or not 1 <= len(requests) <= MAX_REQUESTS:
            return _error(400, f"requests: a list of 1 to {MAX_REQUESTS} requests is required")
        seen: set[str] = set()
        for number, item in enumerate(requests):
            where = f"requests.{number}"
            custom_id = item.get("custom_id") if isinstance(item, dict) else None
            if not isinstance(custom_id, str) or not CUSTOM_ID.fullmatch(custom_id):
                return _error(400, f"{where}.custom_id: String should match pattern "
                                   f"'^{CUSTOM_ID.pattern}$'")
            if custom_id in seen:
                return _error(400, f"{where}.custom_id: Duplicate custom_id {custom_id!r}; "
                                   "custom_ids must be unique within a batch")
            seen.add(custom_id)
            wrong = _missing(item.get("params"), f"{where}.params")
            if wrong is not None:
                return _error(400, wrong)
        if self.refuse_creates:
            status, message = self.refuse_creates.pop(0)
            return _error(status, message)
        batch = Batch(f"msgbatch_{next(self._ids):04d}",
                      [{"custom_id": r["custom_id"], "params": r["params"]} for r in requests],
                      datetime.now(UTC))
        self.batches[batch.id] = batch
        self.created.append(batch.id)
        self.creates_by_requests[frozenset(seen)] += 1
        if self.polls_until_done == 0:
            self._end(batch)
        if self.drop_after_create > 0:
            self.drop_after_create -= 1
            return Answer(drop=True)
        return json_answer(200, batch.view())

    def _list(self, query: dict[str, str]) -> Answer:
        try:
            limit = int(query.get("limit", 20))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 1000:
            return _error(400, "limit: Input should be an integer from 1 to 1000")
        if "after_id" in query and "before_id" in query:
            return _error(400, "at most one of after_id and before_id may be given")
        ids = list(reversed(self.created))
        if "after_id" in query:
            # The page right after the cursor (older batches): what the SDK's pager asks.
            at = ids.index(query["after_id"]) + 1 if query["after_id"] in ids else len(ids)
            page, more = ids[at:at + limit], len(ids) > at + limit
        elif "before_id" in query:
            # The page right before it (newer ones), the nearest to the cursor.
            at = ids.index(query["before_id"]) if query["before_id"] in ids else 0
            page, more = ids[max(0, at - limit):at], at > limit
        else:
            page, more = ids[:limit], len(ids) > limit
        return json_answer(200, {
            "data": [self.batches[i].view() for i in page], "has_more": more,
            "first_id": page[0] if page else None, "last_id": page[-1] if page else None})

    def _retrieve(self, batch_id: str) -> Answer:
        batch = self.batches.get(batch_id)
        if batch is None:
            return _error(404, f"message batch {batch_id} not found")
        if batch.processing_status == "canceling":
            self._end(batch, canceled=True)
        elif batch.processing_status != "ended":
            batch.polls += 1
            if batch.polls > self.polls_until_done:
                self._end(batch)
            else:
                # Never past expire_after, so no request counted succeeded turns expired.
                batch.done = min(len(batch.requests) * batch.polls // (self.polls_until_done + 1),
                                 len(batch.requests) if self.expire_after is None
                                 else self.expire_after)
                batch.counts = Counter(
                    "errored" if r["custom_id"] in self.line_errors else "succeeded"
                    for r in batch.requests[:batch.done])
        return json_answer(200, batch.view())

    def _cancel(self, batch_id: str) -> Answer:
        batch = self.batches.get(batch_id)
        if batch is None:
            return _error(404, f"message batch {batch_id} not found")
        # Anthropic answers the batch as it is when it ended already or is canceling.
        if batch.processing_status == "in_progress":
            batch.processing_status = "canceling"
            batch.cancel_initiated_at = datetime.now(UTC)
        return json_answer(200, batch.view())

    def _results(self, batch_id: str) -> Answer:
        batch = self.batches.get(batch_id)
        if batch is None:
            return _error(404, f"message batch {batch_id} not found")
        if batch.processing_status != "ended":
            return _error(404, f"message batch {batch_id} has no results until it ended")
        data = b"".join(json.dumps(line).encode() + b"\n" for line in batch.results)
        return Answer(200, data, {"Content-Type": "application/binary"})

    # --- results ----------------------------------------------------------------------------

    def _end(self, batch: Batch, *, canceled: bool = False) -> None:
        """Run the batch's requests (all, the first ``expire_after`` when it expires, those
        done so far when canceled) and keep their results; the rest are canceled or expired."""
        run = (batch.done if canceled else len(batch.requests) if self.expire_after is None
               else min(len(batch.requests), self.expire_after))
        batch.results = []
        for number, item in enumerate(batch.requests):
            custom_id = item["custom_id"]
            result: dict[str, Any]
            if number >= run:
                result = {"type": "canceled" if canceled else "expired"}
            elif custom_id in self.line_errors:
                status, message = self.line_errors[custom_id]
                result = {"type": "errored", "error": {"type": "error", "error": {
                    "type": ERROR_TYPES.get(status, "api_error"), "message": message}}}
            else:
                result = {"type": "succeeded", "message": self.message(item["params"])}
            batch.results.append({"custom_id": custom_id, "result": result})
        batch.done = run
        batch.counts = Counter(line["result"]["type"] for line in batch.results)
        batch.processing_status = "ended"
        batch.ended_at = datetime.now(UTC)
        batch.results_url = f"{self.origin}/v1/messages/batches/{batch.id}/results"
