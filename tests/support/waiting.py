"""Waiting for something a test can observe: poll it with a bound, and name it on timeout."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T | None], timeout: float, what: str,
               every: float = 0.5, state: Callable[[], object] | None = None) -> T:
    """Poll ``check`` every ``every`` seconds until it returns something truthy, and return
    that; fail naming ``what`` after ``timeout`` seconds, and what ``state`` reads then."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            seen = "" if state is None else f"; what it saw: {state()}"
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{seen}")
        time.sleep(every)
    return value


class Stall:
    """A bound on a long wait that keeps moving (a drill): it fails once what it watches has not
    changed for ``limit`` seconds, however long the whole wait takes on a busy machine."""

    def __init__(self, limit: float, what: str, now: float) -> None:
        self.limit, self.what = limit, what
        self.seen: object = None
        self.since = now

    def check(self, state: object, now: float) -> None:
        """Note ``state`` seen at ``now`` (monotonic seconds); fail naming what was awaited and
        the state when it has not changed for longer than the limit."""
        if state != self.seen:
            self.seen, self.since = state, now
        elif now - self.since > self.limit:
            raise AssertionError(f"waited for {self.what}, but nothing changed for "
                                 f"{now - self.since:.0f} s (the bound is {self.limit:.0f} s): "
                                 f"{state}")
