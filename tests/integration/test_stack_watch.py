"""The local stack's watch over its children, with real child processes: an exited serve or
worker is started again and reported, a crash loop and the Prefect server's exit stop the stack
with the child's log, the SMTP sink's exit is only reported."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flows.stack.config import StackConfig
from flows.stack.local import SERVER, LocalStack, Restarts
from flows.stack.processes import StackError


def exits_with(code: int, text: str = "") -> list[str]:
    """A child that prints ``text`` and exits with ``code`` at once."""
    return [sys.executable, "-c", f"import sys; print({text!r}); sys.exit({code})"]


@pytest.fixture
def stack(tmp_path: Path) -> LocalStack:
    """A stack whose children the test starts itself (no server, no serve)."""
    return LocalStack(StackConfig(home=tmp_path / "home"), say=lambda line: None)


def test_a_serve_that_keeps_exiting_is_restarted_five_times_then_stops_the_stack(
        stack: LocalStack, tmp_path: Path) -> None:
    """Each exit is reported with the new pid; the sixth within the window is a crash loop,
    reported with the end of its log."""
    said: list[str] = []
    stack.say = said.append
    stack.supervisor.start("serve", exits_with(3, "no deployments found"), {}, cwd=tmp_path)
    with pytest.raises(StackError, match=r"serve exited \(3\) 6 times within 300 s") as raised:
        stack.watch(poll_seconds=0.05)
    assert "no deployments found" in str(raised.value)
    restarted = [line for line in said if line.startswith("serve exited (3); started it again")]
    assert len(restarted) == 5 and "restart 5 of at most 5" in restarted[-1]
    assert len({line.split(" as pid ")[1].split()[0] for line in restarted}) == 5
    stack.supervisor.stop()


def test_the_prefect_server_exiting_stops_the_stack_with_its_log(stack: LocalStack) -> None:
    """Everything else needs the server: it is not restarted behind the person's back."""
    stack.supervisor.start(SERVER, exits_with(1, "address already in use"), {})
    with pytest.raises(StackError, match=r"the Prefect server exited \(1\)") as raised:
        stack.watch(poll_seconds=0.05)
    assert "address already in use" in str(raised.value)
    stack.supervisor.stop()


def test_a_restart_takes_the_exited_childs_place_in_the_stop_order(
        stack: LocalStack) -> None:
    """The restarted child keeps its position, so the stack still stops newest first."""
    supervisor = stack.supervisor
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    first = supervisor.start("sink", sleeper, {})
    dead = supervisor.start("worker-1", exits_with(0), {})
    last = supervisor.start("worker-2", sleeper, {})
    dead.process.wait()
    again = supervisor.restart(dead)
    assert [c.name for c in supervisor.children] == ["sink", "worker-1", "worker-2"]
    assert supervisor.children[1] is again and again.pid != dead.pid
    assert supervisor.stop() == [] and not first.running() and not last.running()


def test_restarts_are_counted_per_child_within_the_window() -> None:
    """Five restarts of one child in five minutes are allowed, a sixth is not; restarts older
    than the window no longer count, and another child has its own count."""
    restarts = Restarts(limit=5, window=300.0)
    assert [restarts.record("serve", t) for t in (0, 10, 20, 30, 40)] == [1, 2, 3, 4, 5]
    assert restarts.record("serve", 50) is None
    assert restarts.record("worker-1", 50) == 1
    assert restarts.record("serve", 300.5) == 5  # the restart at 0 left the window
