"""A Run's lease as a worker holds it: the claim every fenced write presents, and what
register+claim found for one identity."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from store.dialect import db_now
from store.errors import RunConflict
from store.models import Run


@dataclass(frozen=True)
class Claim:
    """Proof of holding a Run's lease: every write presents (run_id, owner, fence)."""

    run_id: str
    owner: str
    fence: int
    attempt_id: str
    lease_expires_at: datetime


@dataclass(frozen=True)
class Registration:
    """What register+claim found for one identity: the Run, the claim when this owner holds
    it now, and the conflict when the identity exists with other parameters (nothing written)."""

    run: Run
    claim: Claim | None
    conflict: RunConflict | None = None


def lease_until() -> sa.ColumnElement[Any]:
    """When a lease given now ends: the database clock plus the ``lease`` parameter (seconds)."""
    return db_now(sa.bindparam("lease", type_=sa.Float()))
