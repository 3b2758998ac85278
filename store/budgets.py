"""Budget windows: what a job may spend per window (one of its periods, or one UTC day), and
the reserve-then-settle transitions that keep it. Before a model call the worker reserves the
call's estimate in one guarded upsert per window, which succeeds only while what is spent, what
is reserved and this estimate together stay within the cap: the row is locked by the statement
(PostgreSQL) or the write transaction (SQLite), so concurrent workers see each other's
reservations; since each estimate is an upper bound of its call's cost (the caller's bound),
what is spent never passes the cap. The answer settles the reservation to the real cost; a call that
failed or was refused releases it; a call lost in flight is charged its estimate."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from store.call_tables import BUDGET_SCOPES, BUDGET_UNITS, BudgetWindow, budget_windows_table
from store.dialect import db_now, upsert
from store.errors import InvalidInput, RunledgerError
from store.fence import RUN_LEASE
from store.identity import require_aware
from store.models import attempts_table, runs_table
from store.statement import NOWHERE, Statement, insert_rows, param, transition

windows = budget_windows_table
runs = runs_table
attempts = attempts_table
MAX_AMOUNT = 2**62  # what a BIGINT column holds with room for one more addition


def check_amount(value: int, name: str) -> int:
    """An amount in a budget's unit (billionths of a currency, or tokens): an integer >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_AMOUNT:
        raise InvalidInput(f"{name} must be an integer between 0 and {MAX_AMOUNT}, got {value!r}")
    return value


@dataclass(frozen=True)
class Window:
    """One budget window of a job and its cap: ``scope`` is period (``start`` is the period's
    start) or day (``start`` is the UTC midnight)."""

    scope: str
    start: datetime
    cap: int

    def __post_init__(self) -> None:
        if self.scope not in BUDGET_SCOPES:
            raise InvalidInput(f"a budget window's scope is one of {', '.join(BUDGET_SCOPES)}, "
                               f"got {self.scope!r}")
        require_aware(self.start, "window start", InvalidInput)
        check_amount(self.cap, "a budget's cap")


@dataclass(frozen=True)
class Charge:
    """What one model call asks of its job's budget: ``estimate`` in ``unit`` (money: billionths
    of ``currency``; tokens) against each of ``windows``."""

    job: str
    unit: str
    currency: str | None
    estimate: int
    windows: tuple[Window, ...]

    def __post_init__(self) -> None:
        if self.unit not in BUDGET_UNITS:
            raise InvalidInput(f"a budget's unit is one of {', '.join(BUDGET_UNITS)}, "
                               f"got {self.unit!r}")
        if (self.unit == "money") != (self.currency is not None):
            raise InvalidInput("a budget in money names its currency; a budget in tokens none")
        check_amount(self.estimate, "a call's estimate")
        if not self.windows:
            raise InvalidInput("a budget charge needs at least one window")

    def window(self, scope: str) -> Window | None:
        return next((w for w in self.windows if w.scope == scope), None)


@dataclass(frozen=True)
class Refusal:
    """The window that had no room for a call's estimate, as it stood."""

    job: str
    window: Window
    unit: str
    currency: str | None
    spent: int
    reserved: int
    estimate: int


class BudgetExhausted(RunledgerError):
    """The job's budget has no room for this model call's estimate; no call was made and no
    reservation was kept. Raise the cap, or wait for the window to reset."""

    def __init__(self, message: str, refusal: Refusal, first: bool = False) -> None:
        super().__init__(message)
        self.refusal = refusal  # the window and what it held
        self.first = first  # the first refusal since the window last had room


def _reserve(d: str) -> Any:
    estimate = sa.bindparam("estimate", type_=sa.BigInteger())
    cap = param(windows.c.cap)
    rows = sa.select(
        param(windows.c.job), param(windows.c.scope), param(windows.c.window_start),
        param(windows.c.unit), param(windows.c.currency), cap, estimate, sa.literal(0),
        sa.literal(1), sa.literal(0), db_now(),
    ).where(estimate <= cap)
    insert = insert_rows(upsert(d, windows),
        ["job", "scope", "window_start", "unit", "currency", "cap", "reserved", "spent", "calls",
         "refused", "updated_at"], rows)
    proposed = insert.excluded
    return insert.on_conflict_do_update(
        index_elements=[windows.c.job, windows.c.scope, windows.c.window_start],
        set_={"reserved": windows.c.reserved + proposed.reserved, "cap": proposed.cap,
              "unit": proposed.unit, "currency": proposed.currency,
              "calls": windows.c.calls + 1, "exhausted_at": sa.null(),
              "updated_at": proposed.updated_at},
        where=windows.c.spent + windows.c.reserved + proposed.reserved <= proposed.cap,
    ).returning(windows.c.reserved)


_RESERVE = Statement(
    "reserve_budget", "Reserve a call's estimate in a job's budget window (creating the window "
    "with the given cap), only if what is spent, what is reserved and the estimate together "
    "stay within the cap; the cap given replaces the stored one (a raised cap applies at once).",
    _reserve)


def _refuse(d: str) -> Any:
    insert = upsert(d, windows).values(
        job=param(windows.c.job), scope=param(windows.c.scope),
        window_start=param(windows.c.window_start), unit=param(windows.c.unit),
        currency=param(windows.c.currency), cap=param(windows.c.cap), reserved=0, spent=0,
        calls=0, refused=1, updated_at=db_now())
    return insert.on_conflict_do_update(
        index_elements=[windows.c.job, windows.c.scope, windows.c.window_start],
        set_={"refused": windows.c.refused + 1, "updated_at": insert.excluded.updated_at},
    ).returning(windows.c.spent, windows.c.reserved)


_REFUSE = Statement(
    "refuse_budget", "Count a call the window had no room for (creating the window if it has "
    "none yet).", _refuse)

_EXHAUST = Statement(
    "exhaust_budget", "Record when the window was first found without room, unless it is "
    "recorded already (a reservation that succeeds again clears it): one statement decides "
    "who says, once, that the budget is exhausted.",
    lambda d: sa.update(windows)
    .where(windows.c.job == param(windows.c.job), windows.c.scope == param(windows.c.scope),
           windows.c.window_start == param(windows.c.window_start),
           windows.c.exhausted_at.is_(None))
    .values(exhausted_at=db_now())
    .returning(windows.c.exhausted_at))


def _move(d: str) -> Any:
    return (
        sa.update(windows)
        .where(windows.c.job == param(windows.c.job), windows.c.scope == param(windows.c.scope),
               windows.c.window_start == param(windows.c.window_start))
        .values(reserved=sa.case(
                    (windows.c.reserved > sa.bindparam("estimate", type_=sa.BigInteger()),
                     windows.c.reserved - sa.bindparam("estimate", type_=sa.BigInteger())),
                    else_=0),
                spent=windows.c.spent + sa.bindparam("cost", type_=sa.BigInteger()),
                updated_at=db_now())
    )


_SETTLE = Statement(
    "settle_budget", "Replace a call's reservation in a window by its real cost (0 to release "
    "it: a call that failed or was refused; its estimate for a call lost in flight).", _move)

_WINDOWS = Statement(
    "list_budget_windows", "A job's budget windows from a moment on, oldest first.",
    lambda d: sa.select(windows)
    .where(windows.c.job == param(windows.c.job),
           windows.c.window_start >= sa.bindparam("since", type_=windows.c.window_start.type))
    .order_by(windows.c.window_start, windows.c.scope))


def give_back(status: Any) -> sa.Update:
    """The Run held by the presented fence given back as ``status`` (a value or expression):
    its lease cleared, ``error`` noted, the attempt it took returned (it did nothing that
    counts against its attempts)."""
    return (
        sa.update(runs)
        .where(RUN_LEASE.holder())
        .values(status=status, owner=sa.null(), lease_expires_at=sa.null(),
                error=param(runs.c.error),
                attempts=sa.case((runs.c.attempts > 0, runs.c.attempts - 1), else_=0),
                updated_at=db_now())
        .returning(runs.c.attempts, runs.c.status))


def end_released_attempt() -> sa.Update:
    """The Attempt of a Run given back ends released, with the reason, and no model call."""
    return (
        sa.update(attempts)
        .where(attempts.c.attempt_id == param(attempts.c.attempt_id))
        .values(outcome="released", error=param(attempts.c.error), model_calls=0,
                finished_at=db_now()))


_RELEASE_RUN = Statement(
    "release_over_budget", "A Run whose next model call the budget refused goes back to "
    "pending with the refusal as its error, and the attempt it took is given back (it did "
    "nothing: reconcile re-drives it, and never gives up on it for budget refusals); only the "
    "current fence holder can.",
    lambda d: give_back("pending"))

_END_ATTEMPT = Statement(
    "end_over_budget_attempt", "The Attempt the budget refused ends released, with the refusal.",
    lambda d: end_released_attempt())


@transition(one_statement_on=NOWHERE)
def release_over_budget_txn(conn: Connection, run_id: str, fence: int, owner: str,
                            attempt_id: str, error: str) -> bool:
    """Release a Run the budget refused: pending again, its attempt given back, the Attempt
    ended released; False (nothing written) when this fence no longer holds it."""
    row = _RELEASE_RUN.first(conn, run_id=run_id, fence=fence, owner=owner, error=error)
    if row is None:
        return False
    _END_ATTEMPT.rows(conn, attempt_id=attempt_id, error=error)
    return True


def _given(charge: Charge, window: Window) -> dict[str, Any]:
    return {"job": charge.job, "scope": window.scope, "window_start": window.start,
            "unit": charge.unit, "currency": charge.currency, "cap": window.cap}


def reserve(conn: Connection, charge: Charge) -> None:
    """Reserve the estimate in every window of the charge, or in none: the first window without
    room raises ``BudgetExhausted`` with its ``Refusal`` (the caller's transaction rolls back
    the reservations already made). A step of a model call's intent (``store.call_plan``)."""
    for window in charge.windows:
        if _RESERVE.first(conn, **_given(charge, window), estimate=charge.estimate) is None:
            raise BudgetExhausted(
                f"job {charge.job}: the {window.scope} budget from {window.start.isoformat()} "
                f"has no room for a call of estimate {charge.estimate}",
                Refusal(charge.job, window, charge.unit, charge.currency, 0, 0, charge.estimate))


@transition(one_statement_on=NOWHERE)
def refuse_txn(conn: Connection, refusal: Refusal, charge: Charge) -> tuple[Refusal, bool]:
    """Count a refused call in its window; True the first time the window is refused since it
    last had room (the moment to say, once, that the budget is exhausted)."""
    row = _REFUSE.first(conn, **_given(charge, refusal.window))
    assert row is not None  # an upsert always returns its row
    first = _EXHAUST.first(conn, **_given(charge, refusal.window)) is not None
    return Refusal(refusal.job, refusal.window, refusal.unit, refusal.currency, row["spent"],
                   row["reserved"], refusal.estimate), first


def settle(conn: Connection, job: str, scope: str, start: datetime, estimate: int,
           cost: int) -> None:
    """Replace ``estimate`` reserved in one window by ``cost`` spent (a step of the model
    call transitions, inside their transaction)."""
    _SETTLE.rows(conn, job=job, scope=scope, window_start=start, estimate=estimate, cost=cost)


_UNIT = Statement(
    "read_budget_unit", "The unit of one of a job's budget windows (money or tokens), if the "
    "window exists.",
    lambda d: sa.select(windows.c.unit)
    .where(windows.c.job == param(windows.c.job), windows.c.scope == param(windows.c.scope),
           windows.c.window_start == param(windows.c.window_start)))


def window_unit(conn: Connection, job: str, scope: str, start: datetime) -> str | None:
    """The unit of a job's budget window, or None when it has no such window."""
    row = _UNIT.first(conn, job=job, scope=scope, window_start=start)
    return None if row is None else str(row["unit"])


def list_windows(conn: Connection, job: str, since: datetime) -> list[BudgetWindow]:
    """A job's budget windows from ``since`` on."""
    return [BudgetWindow.model_construct(**row) for row in _WINDOWS.rows(conn, job=job, since=since)]
