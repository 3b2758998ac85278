"""Waiting for something a test can observe: poll it with a bound, and name it on timeout."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T | None], timeout: float, what: str,
               every: float = 0.5) -> T:
    """Poll ``check`` every ``every`` seconds until it returns something truthy, and return
    that; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)
    return value
