"""A rate-limited OpenAI-compatible server on loopback, as a provider meets a crowd of workers:
each call answers after ``latency`` seconds; ``rate`` calls a second are accepted (a token
bucket holding ``burst`` seconds' worth), and beyond it a call is refused with 429 and
``Retry-After``. ``refuse_at`` refuses chosen calls (by arrival number, from 1) with the
Retry-After given, whatever the bucket holds. It records when each call arrived (the host's
clock, which the ledger's database on this host shares), accepted or refused, and the most
calls it held in flight at once. Used by bench/throughput.py and by
tests/integration/test_endpoint_limits.py."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}


@dataclass
class Arrivals:
    """What the server saw: arrival times (seconds since the epoch) of accepted and refused
    calls, and the peak in flight."""

    accepted: list[float] = field(default_factory=list)
    refused: list[float] = field(default_factory=list)
    peak_in_flight: int = 0

    def most_in_any_second(self) -> int:
        """The most accepted calls that arrived within any one second."""
        times = sorted(self.accepted)
        most, start = 0, 0
        for end, at in enumerate(times):
            while at - times[start] >= 1.0:
                start += 1
            most = max(most, end - start + 1)
        return most


class LimitedModelServer:
    """See the module's docstring; ``rate`` None accepts every call. Serves on 127.0.0.1
    between enter and exit."""

    def __init__(self, rate: float | None, latency: float = 0.0, *, burst: float = 1.0,
                 retry_after: str = "1", refuse_at: dict[int, str] | None = None) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, headers, reply = owner.answer(body)
                try:
                    self.send_response(status)
                    for name, value in {**headers, "Content-Type": "application/json"}.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)
                except OSError:
                    pass  # the client gave up waiting

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.request_queue_size = 1024  # hundreds of calls in flight connect at once
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.rate = rate
        self.latency = latency
        self.capacity = None if rate is None else max(1.0, rate * burst)
        self.retry_after = retry_after
        self.refuse_at = dict(refuse_at or {})
        self.seen = Arrivals()
        self._level = self.capacity or 0.0
        self._at = time.monotonic()
        self._arrived = 0
        self._in_flight = 0
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _take(self) -> str | None:
        """Under the lock: the Retry-After of a refusal, or None (accepted)."""
        self._arrived += 1
        if self._arrived in self.refuse_at:
            return self.refuse_at[self._arrived]
        if self.rate is None or self.capacity is None:
            return None
        now = time.monotonic()
        self._level = min(self.capacity, self._level + (now - self._at) * self.rate)
        self._at = now
        if self._level < 1:
            return self.retry_after
        self._level -= 1
        return None

    def answer(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
        """The status, headers and body of the reply to one call."""
        arrived = time.time()
        with self._lock:
            refusal = self._take()
            if refusal is not None:
                self.seen.refused.append(arrived)
            else:
                self.seen.accepted.append(arrived)
                self._in_flight += 1
                self.seen.peak_in_flight = max(self.seen.peak_in_flight, self._in_flight)
        if refusal is not None:
            return 429, {"Retry-After": refusal}, b'{"error": {"message": "rate limited"}}'
        try:
            time.sleep(self.latency)
            prompt = json.loads(body)["messages"][-1]["content"]
            reply: dict[str, Any] = {"model": "probe-model", "usage": USAGE, "choices": [
                {"index": 0, "message": {"role": "assistant", "content": prompt[:80]}}]}
            return 200, {}, json.dumps(reply).encode()
        finally:
            with self._lock:
                self._in_flight -= 1
