"""The tick's hold on its next subject while Prefect's events worker has too many events unsent
(flows.run_job.outcomes.EventBacklog), against a real queue drained by a thread as the worker drains
its own."""

from __future__ import annotations

import queue
import threading
import time

from flows.run_job.outcomes import EventBacklog
from flows.run_job.stop import Stop


def drained(events: queue.Queue[int], every: float) -> threading.Thread:
    def drain() -> None:
        while True:
            try:
                events.get_nowait()
            except queue.Empty:
                return
            time.sleep(every)

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    return thread


def filled(n: int) -> queue.Queue[int]:
    events: queue.Queue[int] = queue.Queue()
    for i in range(n):
        events.put(i)
    return events


def test_a_subject_waits_until_no_more_than_the_limit_of_events_are_unsent() -> None:
    """With 50 events unsent and a limit of 10, wait returns once the sender brought them down
    to 10 or fewer, not before."""
    events = filled(50)
    backlog = EventBacklog(limit=10, stall_seconds=5, unsent=events.qsize)
    drained(events, 0.005)
    backlog.wait(Stop())
    assert events.qsize() <= 10 and backlog.waited > 0


def test_a_sender_that_sends_nothing_is_waited_for_the_stall_time_then_called_stalled() -> None:
    """A worker that sent none of its events for the stall time (the server away) holds a
    subject that long, then counts as stalled: the tick goes on without waiting for it."""
    events = filled(50)
    backlog = EventBacklog(limit=10, stall_seconds=0.2, unsent=events.qsize)
    backlog.wait(Stop())
    assert backlog.stalled() and backlog.waited >= 0.2 and events.qsize() == 50


def test_a_sender_that_sends_again_after_a_stall_is_waited_for_again() -> None:
    """Once the stalled worker sends again (fewer events unsent than last seen), the next
    subject waits for it as before."""
    events = filled(50)
    backlog = EventBacklog(limit=10, stall_seconds=0.2, unsent=events.qsize)
    backlog.wait(Stop())
    assert backlog.stalled()
    drained(events, 0.005)
    backlog.wait(Stop())
    assert not backlog.stalled() and events.qsize() <= 10


def test_a_stopped_flow_run_does_not_wait_for_its_events() -> None:
    """A flow run that is cancelling starts no more stages: its subjects do not wait either."""
    events = filled(50)
    stop = Stop()
    stop.set()
    backlog = EventBacklog(limit=10, stall_seconds=60, unsent=events.qsize)
    backlog.wait(stop)
    assert events.qsize() == 50 and not backlog.stalled()


def test_below_the_limit_nothing_waits() -> None:
    """With as many events unsent as the limit, wait returns at once."""
    events = filled(10)
    backlog = EventBacklog(limit=10, stall_seconds=60, unsent=events.qsize)
    backlog.wait(Stop())
    assert backlog.waited == 0
