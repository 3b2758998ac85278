"""A flow run's stop: set once when it is cancelled or times out, so that the subjects of its
tick start no more stages and those still queued are released for a later run."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from flows.jobs import TransientError


class FlowRunStopped(TransientError):
    """The flow run was cancelled or timed out before this subject reached a stage: its Run is
    released (pending) for a later run instead of spending a model call nobody waits for."""


class Stop:
    """Set once when the flow run is cancelled or times out. The tick's thread cannot be
    interrupted, so its subjects look here before each stage that costs, and whoever waits for
    them registers what to drop at once (``on_set``): subjects still queued behind a slow stage
    must be released before the worker's grace period ends in SIGKILL."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        with self._lock:
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, or raise FlowRunStopped as soon as the stop is set (a call
        waiting for its endpoint's limits makes no call nobody waits for)."""
        if self._event.wait(seconds):
            raise stopped_before("a model call (waiting for its endpoint's limits)")

    @contextmanager
    def on_set(self, callback: Callable[[], None]) -> Iterator[None]:
        """While inside, call ``callback`` when the stop is set (at once, if it already is);
        it must not block. Leaving forgets it: a tick registers one per batch."""
        with self._lock:
            waiting = not self._event.is_set()
            if waiting:
                self._callbacks.append(callback)
        if not waiting:
            callback()
        try:
            yield
        finally:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)


_interrupted = threading.Event()


def interrupt_process() -> None:
    """Record that the person at the terminal stopped this process (Ctrl-C): the flow runs it
    stops were cancelled by a person, not crashed."""
    _interrupted.set()


def process_interrupted() -> bool:
    """Whether this process was stopped by its person (``interrupt_process``)."""
    return _interrupted.is_set()


def stopped_before(stage: str) -> FlowRunStopped:
    return FlowRunStopped(f"the flow run was cancelled or timed out before {stage}; "
                          "the Run is released for a later run")
