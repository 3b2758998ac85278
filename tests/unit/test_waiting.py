"""Bounded waits: ``wait_until`` names what it waited for and what it saw when it gives up; the
drills' ``Stall`` fails on a stall, never on a long total."""

from __future__ import annotations

import pytest

from tests.support.waiting import Stall, wait_until


def test_a_wait_that_keeps_changing_never_fails_however_long_it_takes() -> None:
    """A state that changes within each limit passes, an hour after the start."""
    stall = Stall(60, "every Run completed", now=0)
    for second in range(0, 3600, 50):
        stall.check({"completed": second}, now=second)


def test_a_state_unchanged_for_longer_than_the_limit_fails_naming_the_wait_and_the_state() -> None:
    """The same state past the limit fails with what was awaited, the time and the state."""
    stall = Stall(60, "every Run completed", now=0)
    stall.check({"completed": 3}, now=10)
    stall.check({"completed": 3}, now=70)
    with pytest.raises(AssertionError, match=r"waited for every Run completed, but nothing "
                       r"changed for 61 s \(the bound is 60 s\): \{'completed': 3\}"):
        stall.check({"completed": 3}, now=71)


def test_a_change_restarts_the_limit() -> None:
    """After a change the state has the whole limit again."""
    stall = Stall(60, "every Run completed", now=0)
    stall.check({"completed": 3}, now=0)
    stall.check({"completed": 4}, now=59)
    stall.check({"completed": 4}, now=118)


def test_a_wait_that_gives_up_names_what_it_waited_for_and_what_it_saw() -> None:
    """A check never met fails with the wait's name and the state read at the end."""
    seen = iter(range(1000))
    with pytest.raises(AssertionError, match=r"^timed out after 0 s waiting for a first tick; "
                       r"what it saw: \{'ticks': \d+\}$"):
        wait_until(lambda: None, 0, "a first tick", every=0,
                   state=lambda: {"ticks": next(seen)})


def test_a_wait_that_is_met_returns_the_check_and_never_reads_the_state() -> None:
    """A check met at once returns its value; the state is only read to explain a failure."""
    def state() -> object:
        raise AssertionError("read the state of a wait that was met")

    assert wait_until(lambda: {"tick": 1}, 0, "a first tick", state=state) == {"tick": 1}
