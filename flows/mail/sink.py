"""An SMTP sink on aiosmtpd for tests and the local stack. It records every accepted message (in
memory, and as .eml files a person can open), counts received and distinct Message-IDs (and with
``dedupe`` stores only the first copy of each), and injects faults: 421/451/550 at RCPT or DATA,
a connection dropped after DATA without a reply, and a reply slower than the client's timeout,
each for the next N messages or for a random (seeded) share of them.

Run it in-process with ``Sink(...).start()`` or in the foreground with
``runledger sink --host 127.0.0.1 --port N --maildir DIR [--dedupe] [--fault SPEC]``; the
foreground sink keeps ``DIR/stats.json`` current for other processes."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import ssl
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from email.parser import BytesHeaderParser
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from flows.ports import free_port
from store import InvalidInput

STAGES = ("rcpt", "data")
REPLIES = {
    "421": "421 4.3.2 Service shutting down (sink fault)",
    "451": "451 4.3.0 Temporary failure, try again later (sink fault)",
    "550": "550 5.1.1 Mailbox unavailable (sink fault)",
}
DATA_ONLY = ("drop", "slow")
STATS_FILE = "stats.json"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class Fault:
    """Answer ``action`` at ``stage`` for the next ``times`` messages (None: every message),
    optionally only for one ``recipient``, and of those only for a random share ``chance`` (drawn
    from the sink's seeded generator). Actions: ``421``, ``451``, ``550`` (a reply instead of
    accepting), ``drop`` (keep the message, close the connection without a reply) and ``slow``
    (keep the message, reply only after ``delay`` seconds)."""

    stage: str
    action: str
    times: int | None = 1
    recipient: str | None = None
    delay: float = 5.0
    chance: float = 1.0

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise InvalidInput(f"fault stage must be one of {', '.join(STAGES)}, got {self.stage!r}")
        if self.action not in (*REPLIES, *DATA_ONLY):
            raise InvalidInput(
                f"fault action must be one of {', '.join([*REPLIES, *DATA_ONLY])}, got {self.action!r}"
            )
        if self.action in DATA_ONLY and self.stage != "data":
            raise InvalidInput(f"fault {self.action!r} happens after DATA; use stage 'data'")
        if self.times is not None and self.times < 1:
            raise InvalidInput(f"fault times must be at least 1, got {self.times}")
        if not 0 < self.chance <= 1:
            raise InvalidInput(f"fault chance must be in (0, 1], got {self.chance}")

    @classmethod
    def parse(cls, spec: str) -> Fault:
        """``STAGE:ACTION[:TIMES[:CHANCE]][@RECIPIENT]``, e.g. ``rcpt:451:2``, ``data:drop``,
        ``data:slow=3:always@a@example.com``, ``rcpt:451:always:0.05`` (TIMES is a number or
        ``always``; CHANCE the share of those messages, 0 to 1)."""
        head, _, recipient = spec.partition("@")
        parts = head.split(":")
        if len(parts) not in (2, 3, 4):
            raise InvalidInput(f"fault {spec!r} is not STAGE:ACTION[:TIMES[:CHANCE]][@RECIPIENT]")
        action, _, delay = parts[1].partition("=")
        times: int | None = 1
        if len(parts) >= 3:
            if parts[2] == "always":
                times = None
            elif parts[2].isdigit():
                times = int(parts[2])
            else:
                raise InvalidInput(f"fault times must be a number or 'always', got {parts[2]!r}")
        try:
            seconds = float(delay) if delay else 5.0
        except ValueError:
            raise InvalidInput(f"fault delay must be a number of seconds, got {delay!r}") from None
        try:
            chance = float(parts[3]) if len(parts) == 4 else 1.0
        except ValueError:
            raise InvalidInput(f"fault chance must be a number, got {parts[3]!r}") from None
        return cls(stage=parts[0], action=action, times=times, recipient=recipient or None,
                   delay=seconds, chance=chance)

    @property
    def reply(self) -> str:
        return REPLIES[self.action]

    @property
    def label(self) -> str:
        """``stage:action`` (with ``=delay`` for a slow reply), as the sink's trace names it."""
        slow = f"={self.delay:g}" if self.action == "slow" else ""
        return f"{self.stage}:{self.action}{slow}"


@dataclass(frozen=True)
class Received:
    """One accepted message as the sink stored it."""

    seq: int
    message_id: str | None
    mail_from: str
    rcpt_tos: tuple[str, ...]
    data: bytes
    path: Path | None


@dataclass
class SinkStats:
    """``received`` counts every accepted message, ``unique`` the distinct Message-IDs among them."""

    received: int = 0
    unique: int = 0
    duplicates: int = 0
    rejected: int = 0
    dropped: int = 0
    slow: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


ACCEPTED = "250"  # the trace's word for a message accepted without a fault


class SinkHandler:
    """The aiosmtpd handler: records, dedupes and injects faults (thread-safe counters).

    ``trace`` has one ``(recipient, what)`` per recipient of each try, in order: the label of
    the fault that ended it (``rcpt:451``, ``data:drop``, ``data:slow=2``) or ``ACCEPTED``."""

    def __init__(self, maildir: Path | None = None, dedupe: bool = False,
                 faults: Iterable[Fault] = (), seed: int | None = None) -> None:
        self.maildir = maildir
        self.dedupe = dedupe
        self.stats = SinkStats()
        self.messages: list[Received] = []
        self.ids: Counter[str] = Counter()
        self.trace: list[tuple[str, str]] = []
        self._faults = list(faults)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._parser = BytesHeaderParser()
        if maildir is not None:
            maildir.mkdir(parents=True, exist_ok=True)

    def _take(self, stage: str, recipients: Iterable[str]) -> Fault | None:
        wanted = {r.lower() for r in recipients}
        with self._lock:
            for fault in self._faults:
                if fault.stage == stage and (fault.recipient is None or
                                             fault.recipient.lower() in wanted) and (
                        fault.chance == 1 or self._rng.random() < fault.chance):
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times == 0:
                            self._faults.remove(fault)
                    return fault
        return None

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str,
                          rcpt_options: list[str]) -> str:
        fault = self._take("rcpt", [address])
        if fault is not None:
            with self._lock:
                self.stats.rejected += 1
                self.trace.append((address, fault.label))
            return fault.reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        fault = self._take("data", envelope.rcpt_tos)
        if fault is not None and fault.action in REPLIES:
            with self._lock:
                self.stats.rejected += 1
                self.trace += [(r, fault.label) for r in envelope.rcpt_tos]
            return fault.reply
        seq = self._record(envelope, ACCEPTED if fault is None else fault.label)
        if fault is not None and fault.action == "drop":
            with self._lock:
                self.stats.dropped += 1
            server.transport.close()  # the client never hears back: it cannot know we have it
            await asyncio.sleep(0.05)
            return "250 OK (dropped; never sent)"
        if fault is not None and fault.action == "slow":
            with self._lock:
                self.stats.slow += 1
            await asyncio.sleep(fault.delay)
        return f"250 2.0.0 OK: queued as {seq}"

    def _record(self, envelope: Any, what: str) -> int:
        data: bytes = envelope.original_content or envelope.content
        message_id = self._parser.parsebytes(data).get("Message-ID")
        message_id = message_id.strip() if message_id else None
        with self._lock:
            self.trace += [(r, what) for r in envelope.rcpt_tos]
            self.stats.received += 1
            seq = self.stats.received
            seen = message_id is not None and self.ids[message_id] > 0
            if message_id is not None:
                self.ids[message_id] += 1
                self.stats.unique = len(self.ids)
            if seen:
                self.stats.duplicates += 1
                if self.dedupe:
                    return seq
            path = None
            if self.maildir is not None:
                name = _SAFE.sub("_", (message_id or "no-message-id").strip("<>"))[:100]
                path = self.maildir / f"{seq:06d}-{name}.eml"
                path.write_bytes(data)
            self.messages.append(Received(seq, message_id, envelope.mail_from,
                                          tuple(envelope.rcpt_tos), data, path))
        return seq

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return self.stats.as_dict()

    def write_stats(self) -> None:
        """Replace ``maildir/stats.json`` atomically (for readers in other processes)."""
        if self.maildir is None:
            return
        target = self.maildir / STATS_FILE
        temporary = target.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.snapshot(), sort_keys=True))
        os.replace(temporary, target)


def _authenticator(username: str, password: str) -> Any:
    def check(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
        ok = isinstance(data, LoginPassword) and (data.login, data.password) == (
            username.encode(), password.encode())
        return AuthResult(success=ok, handled=False)

    return check


@dataclass
class Sink:
    """An SMTP sink in a thread of this process (aiosmtpd's Controller).

    ``credentials`` makes AUTH required (offered without TLS: loopback tests only);
    ``starttls`` offers STARTTLS with that server context; ``implicit_tls`` wraps the port;
    ``seed`` seeds the draws of faults with a ``chance``."""

    host: str = "127.0.0.1"
    port: int = 0
    maildir: Path | None = None
    dedupe: bool = False
    faults: list[Fault] = field(default_factory=list)
    credentials: tuple[str, str] | None = None
    starttls: ssl.SSLContext | None = None
    implicit_tls: ssl.SSLContext | None = None
    seed: int | None = None
    handler: SinkHandler = field(init=False)
    _controller: Controller | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.handler = SinkHandler(self.maildir, self.dedupe, self.faults, self.seed)
        if not self.port:
            self.port = free_port(self.host)

    def start(self) -> Sink:
        options: dict[str, Any] = {}
        if self.credentials is not None:
            # AUTH without TLS is what a loopback test sink offers on purpose.
            warnings.filterwarnings("ignore", "Requiring AUTH while not requiring TLS", UserWarning)
            options.update(authenticator=_authenticator(*self.credentials), auth_required=True,
                           auth_require_tls=False)
        if self.starttls is not None:
            options.update(tls_context=self.starttls)
        self._controller = Controller(
            self.handler, hostname=self.host, port=self.port, ready_timeout=30,
            ssl_context=self.implicit_tls, **options,
        )
        self._controller.start()
        return self

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def __enter__(self) -> Sink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def stats(self) -> dict[str, int]:
        return self.handler.snapshot()

    @property
    def messages(self) -> list[Received]:
        return list(self.handler.messages)

    @property
    def trace(self) -> list[tuple[str, str]]:
        return list(self.handler.trace)

    def wait_for(self, received: int, timeout: float = 10.0) -> bool:
        """Wait until at least ``received`` messages were accepted."""
        deadline = time.monotonic() + timeout
        while self.stats["received"] < received:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


def serve(host: str, port: int, maildir: Path, dedupe: bool = False,
          faults: Iterable[Fault] = (), announce: Callable[[str], None] = print) -> dict[str, int]:
    """Run a sink in the foreground until SIGINT or SIGTERM, keeping ``maildir/stats.json``
    current; returns the final counts."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    sink = Sink(host=host, port=port, maildir=maildir, dedupe=dedupe, faults=list(faults))
    try:
        with sink:
            sink.handler.write_stats()
            announce(f"sink listening on {host}:{port}, writing messages to {maildir}"
                     f"{' (dedupe by Message-ID)' if dedupe else ''}")
            last: dict[str, int] = {}
            while not stop.wait(0.2):
                current = sink.stats
                if current != last:
                    sink.handler.write_stats()
                    last = current
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    sink.handler.write_stats()
    return sink.stats
