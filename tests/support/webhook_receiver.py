"""A real webhook receiver on loopback for the webhook channel's tests and drill: it verifies the
Standard Webhooks signature, honours the ``Idempotency-Key`` (a repeat is answered without being
processed again, another payload under the same key is a 422, a key still in flight a 409) or
ignores it (every POST is processed: a copy is a duplicate), offers a status lookup
(``GET {path}/{key}``: 200 delivered, 404 never seen) or not, and follows scripted faults: a
status before or after processing, a slow answer, a connection dropped after processing."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from standardwebhooks import Webhook, WebhookVerificationError

SECRET = "whsec_" + "c2VjcmV0LWZvci10aGUtdGVzdHMtMDEyMzQ1Njc4OQ=="  # base64 of a test secret
PATH = "/hooks"


@dataclass(frozen=True)
class Fault:
    """How the receiver treats one POST. ``status`` answers that code; with ``processed`` it
    processes the message first (accepted, then an error reply). ``drop`` closes the connection
    without a reply after processing; ``delay`` waits before answering (after processing)."""

    status: int | None = None
    processed: bool = False
    retry_after: str | None = None
    drop: bool = False
    delay: float = 0.0


Chooser = Callable[[str, int], Fault | None]  # (key, POST number of this key) -> fault or None


class WebhookReceiver:
    """Serves POST {path} and GET {path}/{key} on 127.0.0.1 between enter and exit."""

    def __init__(self, *, honour_key: bool = True, lookup: bool = True,
                 secret: str | None = SECRET) -> None:
        self.honour_key = honour_key
        self.lookup = lookup
        self.secret = secret
        self.script: list[Fault] = []  # faults for the next POSTs, in order
        self.chooser: Chooser | None = None  # or one decided per POST (drills)
        self.processed: Counter[str] = Counter()  # key -> times its message was processed
        self.posts: Counter[str] = Counter()  # key -> POSTs received
        self.lookups: Counter[str] = Counter()
        self.bodies: dict[str, str] = {}  # key -> digest of the first processed payload
        self.payloads: dict[str, Any] = {}
        self.bad_signatures = 0
        self.in_flight: set[str] = set()
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                owner._post(self)

            def do_GET(self) -> None:
                owner._get(self)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{PATH}"

    @property
    def duplicates(self) -> int:
        """Messages processed more than once: what an honoured key or a lookup prevents."""
        return sum(n - 1 for n in self.processed.values() if n > 1)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # --- requests ---------------------------------------------------------------------------

    def _next_fault(self, key: str) -> Fault | None:
        with self.lock:
            self.posts[key] += 1
            if self.script:
                return self.script.pop(0)
            number = self.posts[key]
        return self.chooser(key, number) if self.chooser else None

    def _post(self, handler: BaseHTTPRequestHandler) -> None:
        body = handler.rfile.read(int(handler.headers.get("Content-Length", 0)))
        key = handler.headers.get("Idempotency-Key", "")
        if self.secret is not None:
            try:
                Webhook(self.secret).verify(body, dict(handler.headers))
            except WebhookVerificationError:
                with self.lock:
                    self.bad_signatures += 1
                return _reply(handler, 401, {"error": "bad signature"})
        if not key:
            return _reply(handler, 400, {"error": "Idempotency-Key is required"})
        fault = self._next_fault(key)
        digest = hashlib.sha256(body).hexdigest()
        with self.lock:
            if self.honour_key:
                if key in self.in_flight:
                    return _reply(handler, 409, {"error": "a request with this key is in flight"})
                if key in self.bodies:
                    if self.bodies[key] != digest:
                        return _reply(handler, 422, {"error": "key reused with another payload"})
                    return _reply(handler, 200, {"id": key, "replayed": True})
            self.in_flight.add(key)
        if fault is not None and fault.status is not None and not fault.processed:
            with self.lock:
                self.in_flight.discard(key)
            headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
            return _reply(handler, fault.status, {"error": "scripted"}, headers)
        with self.lock:
            self.processed[key] += 1
            self.bodies.setdefault(key, digest)
            self.payloads.setdefault(key, json.loads(body))
            self.in_flight.discard(key)
        if fault is not None and fault.drop:
            handler.close_connection = True
            return None  # processed, and no reply: the sender cannot know
        if fault is not None and fault.delay:
            time.sleep(fault.delay)
        if fault is not None and fault.status is not None:
            return _reply(handler, fault.status, {"error": "scripted after processing"})
        return _reply(handler, 200, {"id": key})

    def _get(self, handler: BaseHTTPRequestHandler) -> None:
        prefix = PATH + "/"
        if not self.lookup or not handler.path.startswith(prefix):
            return _reply(handler, 405, {"error": "no status lookup here"})
        key = handler.path[len(prefix):]
        if self.secret is not None:  # as docs/how-to/outbox.md tells a receiver to
            try:
                Webhook(self.secret).verify(json.dumps(key), dict(handler.headers))
            except WebhookVerificationError:
                with self.lock:
                    self.bad_signatures += 1
                return _reply(handler, 401, {"error": "bad signature"})
        with self.lock:
            self.lookups[key] += 1
            known = key in self.bodies
        if known:
            return _reply(handler, 200, {"id": key, "status": "delivered"})
        return _reply(handler, 404, {"error": "never seen"})


def _reply(handler: BaseHTTPRequestHandler, status: int, body: Any,
           headers: dict[str, str] | None = None) -> None:
    data = json.dumps(body).encode()
    try:
        handler.send_response(status)
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
    except OSError:
        pass  # the sender gave up waiting (a timeout test)
