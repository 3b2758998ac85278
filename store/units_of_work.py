"""What the ledger lends each of its books (``CallBook``, ``OutboxBook``, ``OccurrenceBook``,
``RetentionBook``): its units of work, its database and its documents' size limit. A book's
method is one unit of work around one transition or read, as a ``Ledger`` method is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ParamSpec, Protocol, TypeVar

from sqlalchemy.engine import Engine

from store.database import Database
from store.statement import Transition

P = ParamSpec("P")
T = TypeVar("T")


class UnitsOfWork(Protocol):
    """What the ledger lends its books: its units of work, its database and its documents' size
    limit."""

    database: Database
    max_output_bytes: int

    @property
    def engine(self) -> Engine: ...

    def _write(self, point: str, txn: Transition[P, T], *args: P.args,
               **kwargs: P.kwargs) -> T: ...

    def _read(self, read: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...
