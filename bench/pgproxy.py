"""A loopback TCP proxy in front of PostgreSQL that counts what crosses it and can delay it.

Counting reads the server's side of the wire protocol (clients must connect with
``sslmode=disable``, so that every byte the server sends is a framed message): each
ReadyForQuery ends one round trip, each CommandComplete one statement (BEGIN, COMMIT and
ROLLBACK are counted apart, as transaction control). The delay holds every chunk, in both
directions, ``delay`` seconds after it arrived before passing it on, in order: a database one
network hop away, without ``tc netem`` (which would slow every other user of the loopback
interface). Threads, not asyncio: an event loop's timers wake on whole milliseconds."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import queue
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

CONTROL = {b"BEGIN", b"COMMIT", b"ROLLBACK"}


@dataclass
class Counts:
    """What the server answered through the proxy since the last ``reset``."""

    round_trips: int = 0
    statements: int = 0
    control: int = 0
    tags: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def reset(self) -> None:
        with self.lock:
            self.round_trips = self.statements = self.control = 0
            self.tags = {}

    def add(self, buffer: bytes) -> bytes:
        """Count the whole messages at the start of ``buffer``; returns the incomplete rest."""
        at = 0
        with self.lock:
            while len(buffer) - at >= 5:
                kind = buffer[at:at + 1]
                (length,) = struct.unpack_from("!I", buffer, at + 1)
                if len(buffer) - at < 1 + length:
                    break
                if kind == b"Z":
                    self.round_trips += 1
                elif kind == b"C":
                    tag = buffer[at + 5:at + 1 + length].rstrip(b"\0").split(b" ")[0]
                    if tag in CONTROL:
                        self.control += 1
                    else:
                        self.statements += 1
                    self.tags[tag.decode()] = self.tags.get(tag.decode(), 0) + 1
                at += 1 + length
        return buffer[at:]


def _relay(source: socket.socket, sink: socket.socket, delay: float,
           counts: Counts | None) -> None:
    """Copy ``source`` to ``sink`` until either closes, each chunk ``delay`` s after it arrived."""
    held: queue.SimpleQueue[tuple[float, bytes] | None] = queue.SimpleQueue()

    def release() -> None:
        while (item := held.get()) is not None:
            due, data = item
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
            try:
                sink.sendall(data)
            except OSError:
                return

    sender = threading.Thread(target=release, daemon=True) if delay else None
    if sender is not None:
        sender.start()
    rest = b""
    try:
        while data := source.recv(1 << 16):
            if counts is not None:
                rest = counts.add(rest + data)
            if sender is not None:
                held.put((time.monotonic() + delay, data))
            else:
                sink.sendall(data)
    except OSError:
        pass
    finally:
        if sender is not None:
            held.put(None)
            sender.join()
        for sock in (sink, source):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class Proxy:
    """Listens on an ephemeral loopback port and relays each connection to ``upstream``."""

    def __init__(self, upstream: tuple[str, int], delay: float = 0.0, count: bool = True) -> None:
        self.upstream = upstream
        self.delay = delay
        self.counts = Counts() if count else None
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]

    def serve_forever(self) -> None:
        while True:
            client, _ = self.listener.accept()
            server = socket.create_connection(self.upstream)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=_relay, args=(client, server, self.delay, None),
                             daemon=True).start()
            threading.Thread(target=_relay, args=(server, client, self.delay, self.counts),
                             daemon=True).start()

    def in_thread(self) -> Proxy:
        """Serve from a daemon thread of this process."""
        threading.Thread(target=self.serve_forever, name="pgproxy", daemon=True).start()
        return self


def _serve_process(upstream: tuple[str, int], delay: float, port: Any) -> None:
    proxy = Proxy(upstream, delay, count=False)
    port.value = proxy.port
    proxy.serve_forever()


def in_process(upstream: tuple[str, int], delay: float) -> tuple[int, Any]:
    """A delaying (not counting) proxy in a process of its own, so that it takes no CPU from the
    processes measured; returns its port and the process (terminate it when done)."""
    ctx = mp.get_context("spawn")
    port = ctx.Value("i", 0)
    process = ctx.Process(target=_serve_process, args=(upstream, delay, port), daemon=True)
    process.start()
    for _ in range(400):
        if port.value:
            return int(port.value), process
        process.join(0.05)
    process.terminate()
    raise RuntimeError("the delaying proxy did not start")
