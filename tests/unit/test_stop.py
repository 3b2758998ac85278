"""A flow run's stop (flows.run_job.stop.Stop): what waits on it is called once when it is set, and
only while it is still waiting."""

from __future__ import annotations

import functools

import pytest

from flows.run_job.stop import FlowRunStopped, Stop


def test_a_callback_registered_before_the_stop_is_called_once_when_it_is_set() -> None:
    """Setting the stop calls what is waiting, once; setting it again calls nothing more."""
    stop, calls = Stop(), []
    with stop.on_set(lambda: calls.append("dropped")):
        assert calls == []
        stop.set()
        stop.set()
    assert calls == ["dropped"]


def test_a_callback_registered_after_the_stop_is_set_is_called_at_once() -> None:
    """A batch that starts waiting after the flow run stopped drops its queue at once."""
    stop, calls = Stop(), []
    stop.set()
    with stop.on_set(lambda: calls.append("dropped")):
        assert calls == ["dropped"]


def test_a_callback_is_forgotten_when_its_waiter_leaves() -> None:
    """A tick registers one callback per batch: an ended batch's is not called, nor kept."""
    stop = Stop()
    calls: list[int | str] = []
    for batch in range(3):
        with stop.on_set(functools.partial(calls.append, batch)):
            pass
    with stop.on_set(lambda: calls.append("current")):
        stop.set()
    assert calls == ["current"]


def test_a_wait_for_the_endpoint_ends_at_once_when_the_flow_run_stops() -> None:
    """Stop.sleep returns after its time while running, and raises FlowRunStopped (without
    waiting) once the stop is set."""
    stop = Stop()
    stop.sleep(0)
    stop.set()
    with pytest.raises(FlowRunStopped, match="endpoint's limits"):
        stop.sleep(3600)
