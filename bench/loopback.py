"""A real HTTP server on loopback for the tests of our HTTP clients (the model, a source of
documents, an email provider): each request is answered by the subclass's ``answer``, on a
thread of its own, while the server is entered."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, Self, TypeVar

R = TypeVar("R")


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering (a slow server)
    drop: bool = False  # close the connection without a reply (the request was handled)


def json_answer(status: int, body: Any, headers: dict[str, str] | None = None,
                delay: float = 0.0, *, raw: bytes | None = None) -> Answer:
    """An answer of Content-Type application/json: ``body`` encoded, or ``raw`` bytes as they
    are (a server that claims JSON and sends something else)."""
    payload = json.dumps(body).encode() if raw is None else raw
    return Answer(status, payload, {**(headers or {}), "Content-Type": "application/json"}, delay)


class LoopbackServer:
    """Serves ``answer(request)`` on 127.0.0.1 (or ``host``), on a free port (or ``port``),
    between enter and exit."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def serve(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                answer = owner.answer(Request(self.command, self.path, dict(self.headers),
                                              self.rfile.read(length)))
                time.sleep(answer.delay)
                if answer.drop:
                    self.close_connection = True
                    return
                try:
                    self.send_response(answer.status)
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(answer.body)))
                    self.end_headers()
                    self.wfile.write(answer.body)
                except OSError:
                    pass  # the client gave up waiting (a timeout test)

            do_GET = do_POST = do_PATCH = serve

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def answer(self, request: Request) -> Answer:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop answering and close the port (a server gone down); stopping twice is harmless."""
        self.httpd.shutdown()
        self.httpd.server_close()


class ScriptedServer(LoopbackServer, Generic[R]):
    """A JSON API on loopback that keeps every request and serves the scripted replies first,
    then ``default()`` ones."""

    def __init__(self, default: Callable[[], R]) -> None:
        super().__init__()
        self.script: list[R] = []
        self.requests: list[dict[str, Any]] = []
        self._default = default
        self._lock = threading.Lock()

    def next_reply(self, request: Request) -> tuple[int, dict[str, Any], R]:
        """Keep ``request``; its count (from 1), its JSON body and the reply it gets."""
        with self._lock:
            asked = json.loads(request.body)
            self.requests.append({"path": request.path, "headers": request.headers,
                                  "json": asked})
            reply = self.script.pop(0) if self.script else self._default()
            return len(self.requests), asked, reply
