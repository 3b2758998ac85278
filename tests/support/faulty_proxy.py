"""A reverse proxy on loopback that puts faults in front of a real server (moto's S3 here): per
request a chooser decides to pass it, answer an error without forwarding it, forward it and
drop the connection without the reply, or forward it and answer too late."""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

PASS, ERROR_503, ERROR_500, DROP, SLOW = "pass", "503", "500", "drop", "slow"
Chooser = Callable[[str, str], str]  # (method, path) -> one of the above
_SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
              b"<Message>Please reduce your request rate.</Message></Error>")
_INTERNAL = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
             b"<Message>We encountered an internal error.</Message></Error>")


class FaultyProxy:
    """Forwards to 127.0.0.1:``port`` between enter and exit; ``seen`` counts what it did."""

    def __init__(self, port: int, chooser: Chooser, *, slow_seconds: float = 1.0) -> None:
        self.port = port
        self.chooser = chooser
        self.slow_seconds = slow_seconds
        self.seen: Counter[tuple[str, str]] = Counter()  # (method, what) -> requests
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle_one(self) -> None:
                owner._serve(self)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = handle_one

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        body = handler.rfile.read(int(handler.headers.get("Content-Length", 0) or 0))
        what = self.chooser(handler.command, handler.path)
        with self.lock:
            self.seen[(handler.command, what)] += 1
        if what in (ERROR_503, ERROR_500):
            return _answer(handler, int(what), {"Content-Type": "application/xml"},
                           _SLOW_DOWN if what == ERROR_503 else _INTERNAL)
        upstream = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            headers = {k: v for k, v in handler.headers.items()
                       if k.lower() not in ("connection", "keep-alive")}
            upstream.request(handler.command, handler.path, body=body, headers=headers)
            reply = upstream.getresponse()
            data = reply.read()
            dropped = ("connection", "transfer-encoding") + (
                () if handler.command == "HEAD" else ("content-length",))
            reply_headers = {k: v for k, v in reply.getheaders() if k.lower() not in dropped}
            status = reply.status
        finally:
            upstream.close()
        if what == DROP:
            handler.close_connection = True
            return None  # the server did it; the client hears nothing
        if what == SLOW:
            time.sleep(self.slow_seconds)
        return _answer(handler, status, reply_headers, data, head=handler.command == "HEAD")


def _answer(handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str], data: bytes,
            *, head: bool = False) -> None:
    try:
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        if not head:  # a HEAD reply keeps the object's own Content-Length
            handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if not head:
            handler.wfile.write(data)
    except OSError:
        pass  # the client gave up waiting
