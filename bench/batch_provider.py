"""OpenAI's Files and Batches API on loopback, as the official SDK calls it, for the tests of
batch mode: a JSONL file uploaded (multipart, purpose ``batch``), a batch created of it, polled
(``polls_until_done`` retrieves answer ``in_progress`` first, each a share of the lines
further), listed newest first by pages, cancelled; its output and error files in OpenAI's
shape; and ``POST /v1/chat/completions``, answered at once. Each line (and each synchronous
call) is answered by ``completion(body)`` (a chat completion as ``ModelServer``
answers it) unless ``line_errors`` names its custom_id."""

from __future__ import annotations

import email.policy
import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from email.parser import BytesParser
from typing import Any
from urllib.parse import parse_qs, urlsplit

from bench.loopback import Answer, LoopbackServer, Request, json_answer
from bench.structured import answer_text

URL = "/v1/chat/completions"
ENDED = ("completed", "expired", "cancelled", "failed")
PROMPT_TOKENS, COMPLETION_TOKENS = 100, 20
EXPIRED = "This request could not be executed before the completion window expired."
CANCELLED = "This request was not executed: the batch was cancelled."


@dataclass
class File:
    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: int

    def view(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": len(self.data),
                "created_at": self.created_at, "filename": self.filename,
                "purpose": self.purpose, "status": "processed", "expires_at": None,
                "status_details": None}


@dataclass
class Batch:
    """A batch and how far it went: ``polls`` retrieves so far, ``done`` lines run (the
    first ones of its file); its lines' results once it ended."""

    id: str
    input_file_id: str
    metadata: dict[str, str]
    lines: list[dict[str, Any]]
    created_at: int
    status: str = "validating"
    polls: int = 0
    done: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    completed: int = 0
    failed: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    times: dict[str, int] = field(default_factory=dict)

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id, "object": "batch", "endpoint": URL,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id, "completion_window": "24h",
            "status": self.status, "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id, "created_at": self.created_at,
            "expires_at": self.created_at + 86_400,
            **{f"{event}_at": self.times.get(event) for event in (
                "in_progress", "finalizing", "completed", "failed", "expired", "cancelling",
                "cancelled")},
            "request_counts": {"total": len(self.lines), "completed": self.completed,
                               "failed": self.failed},
            "metadata": self.metadata or None, "model": None, "usage": None,
        }


def _error(status: int, message: str, code: str | None = None) -> Answer:
    return json_answer(status, {"error": {"message": message, "type": "invalid_request_error",
                                          "param": None, "code": code}})


class BatchServer(LoopbackServer):
    """The Files and Batches API of an OpenAI-compatible provider on loopback. Knobs:
    ``polls_until_done`` (retrieves answered ``in_progress`` before the batch ends; 0: ended
    when created), ``expire_after`` (the batch ends ``expired`` with only that many lines
    run), ``line_errors`` (custom_id -> (HTTP status, message): that line's error response),
    ``drop_after_create`` (the next N creates create the batch, then close the connection
    without a reply), ``queue_full`` (the next N creates fail the batch as a whole with
    ``token_limit_exceeded``, as OpenAI does when the model's enqueued tokens are at their
    limit), ``completion`` (a line's body -> its chat completion). What it saw:
    ``creates_by_key`` (creates per ``runledger_batch`` metadata, dropped ones included),
    ``created`` (batch ids, oldest first), ``requests`` (method and path)."""

    def __init__(self) -> None:
        super().__init__()
        self.polls_until_done = 0
        self.expire_after: int | None = None
        self.line_errors: dict[str, tuple[int, str]] = {}
        self.drop_after_create = 0
        self.queue_full = 0
        self.completion: Callable[[dict[str, Any]], dict[str, Any]] = self.chat_completion
        self.creates_by_key: Counter[str] = Counter()
        self.created: list[str] = []
        self.requests: list[tuple[str, str]] = []
        self.files: dict[str, File] = {}
        self.batches: dict[str, Batch] = {}
        self._ids = itertools.count(1)
        self._answers = itertools.count(1)
        self._lock = threading.RLock()

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """A chat completion of ``body`` as ``ModelServer`` writes it: ``answer N`` (N counts
        the lines answered), as a document of the body's JSON schema when it asks for
        structured output; 100 prompt and 20 completion tokens; the body's model."""
        number = next(self._answers)
        return {
            "id": f"chatcmpl-{number}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model"),
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None, "message": {
                "role": "assistant", "content": answer_text(body, f"answer {number}"),
                "refusal": None}}],
            "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS,
                      "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS},
        }

    # --- requests ---------------------------------------------------------------------------

    def answer(self, request: Request) -> Answer:
        url = urlsplit(request.path)
        parts = url.path.strip("/").split("/")
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        with self._lock:
            self.requests.append((request.method, url.path))
            match request.method, parts:
                case "POST", ["v1", "files"]:
                    return self._upload(request)
                case "GET", ["v1", "files", file_id, "content"]:
                    return self._content(file_id)
                case "POST", ["v1", "batches"]:
                    return self._create(json.loads(request.body))
                case "GET", ["v1", "batches"]:
                    return self._list(query)
                case "GET", ["v1", "batches", batch_id]:
                    return self._retrieve(batch_id)
                case "POST", ["v1", "batches", batch_id, "cancel"]:
                    return self._cancel(batch_id)
                case "POST", ["v1", "chat", "completions"]:
                    # The synchronous API beside it, with the same answers and token counts:
                    # what a benchmark compares the batch price with.
                    return json_answer(200, self.completion(json.loads(request.body)))
            return _error(404, f"no route {request.method} {url.path}")

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids):04d}"

    def _upload(self, request: Request) -> Answer:
        head = f"Content-Type: {request.headers.get('Content-Type', '')}\r\n\r\n".encode()
        form = BytesParser(policy=email.policy.HTTP).parsebytes(head + request.body)
        fields: dict[str, tuple[str | None, bytes]] = {}
        for part in form.iter_parts():
            payload = part.get_payload(decode=True)
            name = part.get_param("name", header="content-disposition")
            if isinstance(name, str) and isinstance(payload, bytes):
                fields[name] = (part.get_filename(), payload)
        if "file" not in fields or "purpose" not in fields:
            return _error(400, "a file and its purpose are required")
        purpose = fields["purpose"][1].decode()
        if purpose != "batch":
            return _error(400, f"this server takes batch files only, not {purpose!r}")
        filename, data = fields["file"]
        found = File(self._new_id("file"), filename or "upload.jsonl", purpose, data,
                     int(time.time()))
        self.files[found.id] = found
        return json_answer(200, found.view())

    def _content(self, file_id: str) -> Answer:
        found = self.files.get(file_id)
        if found is None:
            return _error(404, f"no such file: {file_id}")
        return Answer(200, found.data, {"Content-Type": "application/octet-stream"})

    def _create(self, asked: dict[str, Any]) -> Answer:
        if asked.get("endpoint") != URL or asked.get("completion_window") != "24h":
            return _error(400, f"only {URL} batches with a 24h window are served here")
        source = self.files.get(str(asked.get("input_file_id")))
        if source is None:
            return _error(404, f"no such file: {asked.get('input_file_id')}")
        metadata = dict(asked.get("metadata") or {})
        batch = Batch(self._new_id("batch"), source.id, metadata, [], int(time.time()))
        self._validate(batch, source.data)
        if self.queue_full > 0 and batch.status != "failed":
            self.queue_full -= 1
            batch.errors.append({"code": "token_limit_exceeded", "line": None, "param": None,
                                 "message": "Enqueued token limit reached for probe-model. "
                                            "Please try again once some in_progress batches "
                                            "have been completed."})
            batch.status = "failed"
            batch.times["failed"] = int(time.time())
        self.batches[batch.id] = batch
        self.created.append(batch.id)
        self.creates_by_key[metadata.get("runledger_batch", "")] += 1
        if batch.status != "failed" and self.polls_until_done == 0:
            self._end(batch)
        if self.drop_after_create > 0:
            self.drop_after_create -= 1
            return Answer(drop=True)
        return json_answer(200, batch.view())

    def _validate(self, batch: Batch, data: bytes) -> None:
        """The file's lines, or the batch failed with what is wrong (as OpenAI validates)."""
        seen: set[str] = set()
        for number, raw in enumerate(data.splitlines(), 1):
            try:
                line = json.loads(raw)
                custom_id, body = line["custom_id"], line["body"]
                if line["method"] != "POST" or line["url"] != URL or custom_id in seen:
                    raise ValueError(f"a POST {URL} line with a new custom_id is wanted")
            except (ValueError, KeyError, TypeError) as exc:
                batch.errors.append({"code": "invalid_request", "line": number,
                                     "message": str(exc), "param": None})
                continue
            seen.add(custom_id)
            batch.lines.append({"custom_id": custom_id, "body": body})
        if not batch.lines and not batch.errors:
            batch.errors.append({"code": "empty_file", "line": None, "param": None,
                                 "message": "The batch input file is empty."})
        if batch.errors:
            batch.status = "failed"
            batch.times["failed"] = int(time.time())

    def _list(self, query: dict[str, str]) -> Answer:
        newest = [self.batches[i] for i in reversed(self.created)]
        after = query.get("after")
        if after is not None:
            ids = [b.id for b in newest]
            newest = newest[ids.index(after) + 1:] if after in ids else []
        limit = max(1, min(100, int(query.get("limit", 20))))
        page = newest[:limit]
        return json_answer(200, {
            "object": "list", "data": [b.view() for b in page],
            "first_id": page[0].id if page else None, "last_id": page[-1].id if page else None,
            "has_more": len(newest) > limit})

    def _retrieve(self, batch_id: str) -> Answer:
        batch = self.batches.get(batch_id)
        if batch is None:
            return _error(404, f"no such batch: {batch_id}")
        if batch.status == "cancelling":
            self._end(batch, cancelled=True)
        elif batch.status not in ENDED:
            batch.polls += 1
            if batch.polls > self.polls_until_done:
                self._end(batch)
            else:
                batch.status = "in_progress"
                batch.times.setdefault("in_progress", int(time.time()))
                batch.done = len(batch.lines) * batch.polls // (self.polls_until_done + 1)
                batch.completed = batch.done
        return json_answer(200, batch.view())

    def _cancel(self, batch_id: str) -> Answer:
        batch = self.batches.get(batch_id)
        if batch is None:
            return _error(404, f"no such batch: {batch_id}")
        if batch.status in ENDED:
            return _error(409, f"Cannot cancel a batch with status '{batch.status}'.")
        batch.status = "cancelling"
        batch.times["cancelling"] = int(time.time())
        return json_answer(200, batch.view())

    # --- results ----------------------------------------------------------------------------

    def _end(self, batch: Batch, *, cancelled: bool = False) -> None:
        """Run the batch's lines (all, the first ``expire_after`` when it expires, those done
        so far when cancelled) and write its files; the rest are error lines."""
        expired = not cancelled and self.expire_after is not None
        run = (batch.done if cancelled else
               min(len(batch.lines), self.expire_after) if self.expire_after is not None
               else len(batch.lines))
        outputs: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        for line in batch.lines[:run]:
            custom_id = line["custom_id"]
            if custom_id in self.line_errors:
                status, message = self.line_errors[custom_id]
                body: dict[str, Any] = {"error": {
                    "message": message, "type": "server_error" if status >= 500
                    else "invalid_request_error", "param": None, "code": None}}
                errors.append(self._result(custom_id, status, body))
            else:
                outputs.append(self._result(custom_id, 200, self.completion(line["body"])))
        code, message = ("batch_cancelled", CANCELLED) if cancelled else ("batch_expired",
                                                                          EXPIRED)
        for line in batch.lines[run:]:
            errors.append({"id": self._new_id("batch_req"), "custom_id": line["custom_id"],
                           "response": None, "error": {"code": code, "message": message}})
        batch.output_file_id = self._output(batch, "output", outputs)
        batch.error_file_id = self._output(batch, "error", errors)
        batch.done, batch.completed = run, len(outputs)
        batch.failed = len(errors) - (len(batch.lines) - run)
        batch.status = "cancelled" if cancelled else "expired" if expired else "completed"
        batch.times[batch.status] = int(time.time())

    def _result(self, custom_id: str, status: int, body: dict[str, Any]) -> dict[str, Any]:
        return {"id": self._new_id("batch_req"), "custom_id": custom_id, "response": {
            "status_code": status, "request_id": self._new_id("req"), "body": body},
            "error": None}

    def _output(self, batch: Batch, kind: str, lines: list[dict[str, Any]]) -> str | None:
        if not lines:
            return None
        data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        found = File(self._new_id("file"), f"{batch.id}_{kind}.jsonl", "batch_output", data,
                     int(time.time()))
        self.files[found.id] = found
        return found.id
