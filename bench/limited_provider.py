"""A rate-limited OpenAI-compatible server on loopback, as a provider meets a crowd of workers:
each call answers after ``latency`` seconds; ``rate`` calls a second are accepted (a token
bucket holding ``burst`` seconds' worth), and beyond it a call is refused with 429 and
``Retry-After``. ``refuse_at`` refuses chosen calls (by arrival number, from 1) with the
Retry-After given, whatever the bucket holds. It records when each call arrived (the host's
clock, which the ledger's database on this host shares), accepted or refused, and the most
calls it held in flight at once. With ``announce="openai"`` every reply (429s too) announces
its limits as OpenAI does: ``x-ratelimit-limit-requests`` (R a minute),
``-remaining-requests`` and ``-reset-requests`` (a duration such as ``1.5s`` or ``120ms``) of a
minute's quota refilled evenly, and the same for tokens when ``tokens_per_minute`` is given (a
quota it announces, not one it enforces); with ``announce="garbage"``, headers of those names
that do not parse. Used by bench/throughput.py and by
tests/integration/test_endpoint_limits.py and test_announced_limits.py."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, Self

USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
Announce = Literal["openai", "garbage"]
GARBAGE = {"x-ratelimit-limit-requests": "lots", "x-ratelimit-remaining-requests": "-3",
           "x-ratelimit-reset-requests": "soon", "x-ratelimit-limit-tokens": "1e999",
           "x-ratelimit-remaining-tokens": "", "x-ratelimit-reset-tokens": "6 minutes"}


def duration(seconds: float) -> str:
    """A duration as OpenAI writes its resets: ``120ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:.1f}s" if minutes else f"{rest:.1f}s"


@dataclass
class MinuteQuota:
    """A quota of ``limit`` a minute, refilled evenly, as a provider announces it."""

    limit: int
    level: float
    at: float

    def take(self, amount: float, now: float) -> None:
        self.level = min(self.limit, self.level + (now - self.at) * self.limit / 60) - amount
        self.level = max(0.0, self.level)
        self.at = now

    def headers(self, kind: str) -> dict[str, str]:
        reset = (self.limit - self.level) * 60 / self.limit
        return {f"x-ratelimit-limit-{kind}": str(self.limit),
                f"x-ratelimit-remaining-{kind}": str(int(self.level)),
                f"x-ratelimit-reset-{kind}": duration(reset)}


@dataclass
class Arrivals:
    """What the server saw: arrival times (seconds since the epoch) of accepted and refused
    calls, and the peak in flight."""

    accepted: list[float] = field(default_factory=list)
    refused: list[float] = field(default_factory=list)
    peak_in_flight: int = 0

    def timeline(self, window: float) -> str:
        """The accepted calls of each ``window`` seconds from the first arrival, and when each
        refusal arrived: where a run lost its time."""
        start = min(self.accepted + self.refused)
        counts = [0] * (int((max(self.accepted) - start) // window) + 1)
        for at in self.accepted:
            counts[int((at - start) // window)] += 1
        refusals = ", ".join(f"{at - start:.1f}" for at in sorted(self.refused)) or "none"
        return (f"accepted per {window:g} s: {' '.join(map(str, counts))}; "
                f"429s at (s): {refusals}")

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
                 retry_after: str = "1", refuse_at: dict[int, str] | None = None,
                 announce: Announce | None = None,
                 tokens_per_minute: int | None = None) -> None:
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
        self.announce = announce
        started = time.monotonic()
        self._requests = None if rate is None else MinuteQuota(round(rate * 60), rate * 60,
                                                               started)
        self._tokens = None if tokens_per_minute is None else MinuteQuota(
            tokens_per_minute, tokens_per_minute, started)
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

    def _announced(self, accepted: bool) -> dict[str, str]:
        """Under the lock: the rate-limit headers of a reply (an accepted call takes its share
        of the minute's quotas first)."""
        if self.announce == "garbage":
            return dict(GARBAGE)
        if self.announce is None:
            return {}
        now = time.monotonic()
        headers: dict[str, str] = {}
        for quota, kind, used in ((self._requests, "requests", 1),
                                  (self._tokens, "tokens", USAGE["total_tokens"])):
            if quota is not None:
                quota.take(used if accepted else 0, now)
                headers.update(quota.headers(kind))
        return headers

    def answer(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
        """The status, headers and body of the reply to one call."""
        arrived = time.time()
        with self._lock:
            refusal = self._take()
            announced = self._announced(refusal is None)
            if refusal is not None:
                self.seen.refused.append(arrived)
            else:
                self.seen.accepted.append(arrived)
                self._in_flight += 1
                self.seen.peak_in_flight = max(self.seen.peak_in_flight, self._in_flight)
        if refusal is not None:
            return (429, {**announced, "Retry-After": refusal},
                    b'{"error": {"message": "rate limited"}}')
        try:
            time.sleep(self.latency)
            prompt = json.loads(body)["messages"][-1]["content"]
            reply: dict[str, Any] = {"model": "probe-model", "usage": USAGE, "choices": [
                {"index": 0, "message": {"role": "assistant", "content": prompt[:80]}}]}
            return 200, announced, json.dumps(reply).encode()
        finally:
            with self._lock:
                self._in_flight -= 1
