"""The ledger's retention (``Ledger.retention``): pruning completed Runs to tombstones in
batches (``store.tombstones``), each batch one unit of work followed by its fault point, and
making the freed space reusable (``store.dialect.vacuum``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from store import faults
from store.dialect import vacuum
from store.driver_errors import domain_errors
from store.tombstones import Prunable, Pruned, count_prunable, prune_batch_txn
from store.units_of_work import UnitsOfWork


class RetentionBook:
    """What pruning would do, pruning itself batch by batch, and the vacuum after it
    (``Ledger.retention``)."""

    def __init__(self, ledger: UnitsOfWork) -> None:
        self._ledger = ledger

    def prune_batch(self, cutoff: datetime, jobs: Sequence[str], *, limit: int = 1000,
                    after: str = "") -> Pruned:
        """Make tombstones of the Runs of ``jobs`` completed before ``cutoff`` among the next
        ``limit`` after ``after``, in one short transaction (see ``prune_batch_txn``); pass
        the returned cursor as ``after`` to the next batch, until it is None."""
        return self._ledger._write(faults.AFTER_PRUNE_BATCH_COMMIT, prune_batch_txn,
                                   cutoff, jobs, limit, after)

    def prunable(self, cutoff: datetime, jobs: Sequence[str]) -> Prunable:
        """What pruning ``jobs`` with ``cutoff`` would do and leave alone, without writing."""
        return self._ledger._read(count_prunable, cutoff, jobs)

    def vacuum(self) -> None:
        """Make the space freed by pruning reusable (PostgreSQL: a plain VACUUM; see
        ``store.dialect.vacuum``)."""
        ledger = self._ledger
        with domain_errors(ledger.database.busy.postgres_lock_timeout_ms), \
                ledger.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            vacuum(conn)
