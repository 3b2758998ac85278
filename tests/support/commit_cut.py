"""A loopback TCP proxy between the ledger and PostgreSQL that cuts the connection at the commit
of a chosen statement: ``before`` (the commit is swallowed, the server never applies it) or
``after`` (the commit is passed on, the server's ReadyForQuery awaited, and the reply never
reaches the client). Either way the client sees a dropped connection and cannot know which.

It reads the wire protocol just enough: client messages are grouped into batches ending at a
Sync or a simple Query; a statement's commit is its batch's Sync when the server was idle
before it (psycopg in autocommit: an implicit transaction ends at Sync), or the simple Query
``COMMIT`` that psycopg sends for ``commit()`` closing a transaction that ran it. Statements are
recognized by their Parse text, so only before psycopg prepares them (its prepare_threshold, 5
executions on one connection): cut on a fresh connection. Connect with ``sslmode=disable`` and
``gssencmode=disable`` (the proxy reads plain text)."""

from __future__ import annotations

import re
import selectors
import socket
import struct
import threading
from dataclasses import dataclass, field

from store.catalogue import engine_dialect
from store.statement import STATEMENTS

Message = tuple[bytes, bytes]  # (type byte, whole message)


def statement_sql(name: str) -> str:
    """The SQL the named statement sends to PostgreSQL (store/sql/postgresql.sql shows it with
    its parameters by name)."""
    return _normalized(STATEMENTS[name].compiled(engine_dialect("postgresql")).sql)


def _normalized(sql: str) -> str:
    # psycopg sends %s placeholders as $1, $2...
    return " ".join(re.sub(r"\$\d+", "%s", sql).split())


def _query_text(kind: bytes, message: bytes) -> str | None:
    """The SQL of a simple Query or a Parse message."""
    body = message[5:]
    if kind == b"Q":
        return body.split(b"\0", 1)[0].decode("utf-8", "replace")
    if kind == b"P":
        return body.split(b"\0", 2)[1].decode("utf-8", "replace")
    return None


@dataclass
class Cut:
    """Where to cut: at the commit of ``sql`` (a statement's normalized SQL)."""

    when: str  # "before" or "after"
    sql: str
    done: threading.Event = field(default_factory=threading.Event)


class _Link:
    """One client connection and its server connection, pumped by one thread."""

    def __init__(self, proxy: CommitCutProxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = socket.create_connection(proxy.upstream)
        self.from_client = b""
        self.from_server = b""
        self.started = False  # the untyped startup message has gone through
        self.batch: list[Message] = []
        self.idle = True  # the server's last ReadyForQuery said idle (no open transaction)
        self.ran_it = False  # the open transaction ran the statement to cut
        self.cutting: Cut | None = None  # forwarded the commit; waiting for ReadyForQuery

    def run(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self.client, selectors.EVENT_READ, "client")
            selector.register(self.server, selectors.EVENT_READ, "server")
            try:
                while not self.proxy.stopping.is_set():
                    for key, _ in selector.select(0.1):
                        data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                        if not data or not (self._client(data) if key.data == "client"
                                            else self._server(data)):
                            return
            except OSError:
                return
            finally:
                self.client.close()
                self.server.close()

    def _client(self, data: bytes) -> bool:
        self.from_client += data
        if not self.started:
            if len(self.from_client) < 4:
                return True
            (length,) = struct.unpack("!I", self.from_client[:4])
            if len(self.from_client) < length:
                return True
            code = struct.unpack("!I", self.from_client[4:8])[0]
            assert code >> 16 == 3, "connect with sslmode=disable and gssencmode=disable"
            self.server.sendall(self.from_client[:length])
            self.from_client = self.from_client[length:]
            self.started = True
        while (found := _first_message(self.from_client)) is not None:
            kind, message = found
            self.from_client = self.from_client[len(message):]
            self.batch.append((kind, message))
            if kind in (b"S", b"Q", b"H", b"X") and not self._send_batch():
                return False
        return True

    def _send_batch(self) -> bool:
        """Forward the batch, unless it is the commit to cut (False: the link is done)."""
        batch, self.batch = self.batch, []
        texts = [t for k, m in batch if (t := _query_text(k, m)) is not None]
        cut = self.proxy.armed
        runs_it = cut is not None and any(_normalized(t) == cut.sql for t in texts)
        commits = any(t.strip().upper() == "COMMIT" for t in texts)
        if cut is not None and ((runs_it and self.idle) or (commits and self.ran_it)):
            self.proxy.armed = None
            if cut.when == "before":
                cut.done.set()
                return False
            self.cutting = cut
        elif runs_it:
            self.ran_it = True
        if commits or any(t.strip().upper() == "ROLLBACK" for t in texts):
            self.ran_it = False
        self.server.sendall(b"".join(m for _, m in batch))
        return True

    def _server(self, data: bytes) -> bool:
        self.from_server += data
        while (found := _first_message(self.from_server)) is not None:
            kind, message = found
            self.from_server = self.from_server[len(message):]
            if kind == b"Z":
                self.idle = message[5:6] == b"I"
                if self.cutting is not None:  # the server has applied the commit
                    self.cutting.done.set()
                    return False
            if self.cutting is None:
                self.client.sendall(message)
        return True


def _first_message(buffer: bytes) -> tuple[bytes, bytes] | None:
    """The kind and bytes of the first whole wire-protocol message in ``buffer``, or None
    while it has not all arrived."""
    if len(buffer) < 5:
        return None
    (length,) = struct.unpack("!I", buffer[1:5])
    return (buffer[:1], buffer[:1 + length]) if len(buffer) >= 1 + length else None


class CommitCutProxy:
    """Listens on loopback and relays to ``upstream``; ``arm`` one cut at a time."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.armed: Cut | None = None
        self.stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, name="commit-cut-proxy")

    def arm(self, when: str, statement: str) -> Cut:
        """Cut ``when`` the next commit of the named statement (store/sql) goes by."""
        assert when in ("before", "after"), when
        self.armed = Cut(when, statement_sql(statement))
        return self.armed

    def _accept(self) -> None:
        self.listener.settimeout(0.1)
        while not self.stopping.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            link = _Link(self, client)
            thread = threading.Thread(target=link.run, name="commit-cut-link")
            self._threads.append(thread)
            thread.start()

    def __enter__(self) -> CommitCutProxy:
        self._acceptor.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self._acceptor.join()
        self.listener.close()
        for thread in self._threads:
            thread.join()
