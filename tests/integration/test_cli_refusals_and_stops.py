"""`runledger run` refuses bad arguments before any server or ledger (one line, exit 2) and a
period not yet due unless --allow-not-due; Ctrl-C from a terminal (SIGINT to the whole process
group, through a pty) stops it in order: a server of its own survives, the Runs in flight are
completed or released, nothing stays leased, no stream of event errors, exit 130."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.stack import commands
from store import Ledger
from tests.support.waiting import wait_until

pytestmark = pytest.mark.processes

JOB = "competitor-summary"
PERIOD = "2026-11-20"
SCRIPT = shutil.which("script")


def cli_env(ledger_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNLEDGER_",))}
    env.pop("PREFECT_API_URL", None)  # the command starts a server of its own
    env.update({"RUNLEDGER_DATABASE_URL": ledger_url, "RUNLEDGER_MODEL": "offline",
                "RUNLEDGER_MAIL_FROM": "runledger@example.org", "COLUMNS": "400", **extra})
    return env


@pytest.mark.parametrize(("args", "message"), [
    (["no-such-job"], "unknown job 'no-such-job'; registered jobs: competitor-summary"),
    ([JOB, "--period", "2026-13-01"], "period '2026-13-01' is not a date"),
    ([JOB, "--subject", "nobody", "--period", PERIOD], "has no subject 'nobody'"),
    ([JOB, "--period", "2099-01-05"], "period 2099-01-05 of job competitor-summary is not due "
                                      "until 2099-01-05 07:00 CET"),
])
def test_bad_arguments_are_refused_in_one_line_before_any_server_or_ledger(
        tmp_path: Path, args: list[str], message: str) -> None:
    """Exit 2, one line on stderr, no traceback, no ledger file, no server started."""
    ledger = tmp_path / "ledger.db"
    done = subprocess.run(commands.runledger_argv("run", *args), env=cli_env(
        f"sqlite:///{ledger}"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert said.startswith("error: ") and message in said
    assert "Traceback" not in done.stderr and "server" not in done.stderr
    assert not ledger.exists()


def test_a_period_not_yet_due_names_the_flag_and_the_parameter_that_allow_it(
        tmp_path: Path) -> None:
    """The refusal says how to run it anyway, in the CLI and in a Custom run."""
    done = subprocess.run(commands.runledger_argv("run", JOB, "--period", "2099-01-05"),
                          env=cli_env(f"sqlite:///{tmp_path / 'l.db'}"), capture_output=True,
                          text=True, timeout=120)
    said = " ".join(done.stderr.split())
    assert "--allow-not-due (CLI) or the parameter allow_not_due=true (Custom run)" in said


@pytest.fixture
def migrated(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger.connect(url)
    ledger.migrate()
    ledger.close()
    yield url


class Terminal:
    """`runledger run` in a pty (``script``): a Ctrl-C typed there is SIGINT to the command's
    whole foreground process group, as in a person's terminal."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        assert SCRIPT, "script (util-linux) runs the command in a pty"
        command = " ".join(commands.runledger_argv(*args))
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [SCRIPT, "-q", "-e", "-c", command, "/dev/null"], env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def ctrl_c(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"\x03")
        self.process.stdin.flush()

    def finish(self, timeout: float) -> tuple[int, str]:
        out, _ = self.process.communicate(timeout=timeout)
        return self.process.returncode, out.decode(errors="replace")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate(timeout=30)


def at_the_model(url: str) -> bool:
    """The first subject's input is stored: its transform (the slow model call) is under way."""
    with Ledger.connect(url) as ledger:
        return any(r.raw_input is not None for r in ledger.runs(job=JOB))


@pytest.mark.skipif(sys.platform != "linux", reason="a pty through util-linux script")
@pytest.mark.parametrize("presses", [1, 2], ids=["one-ctrl-c", "two-ctrl-c"])
def test_ctrl_c_from_a_terminal_stops_run_in_order_and_leaves_nothing_leased(
        migrated: str, presses: int) -> None:
    """One Ctrl-C: the subject at the model finishes and completes, the other is released;
    a second Ctrl-C: the one at the model is released too, at once. Both: exit 130, the
    message about subjects in flight, the Runs' states, no event error, no Run leased."""
    terminal = Terminal(["run", JOB, "--period", PERIOD], cli_env(
        migrated, RUNLEDGER_OFFLINE_MODEL_DELAY_SECONDS="20", RUNLEDGER_SUBJECT_CONCURRENCY="1"))
    try:
        wait_until(lambda: at_the_model(migrated), 420, "the first subject's model call")
        terminal.ctrl_c()
        if presses == 2:
            time.sleep(2)
            terminal.ctrl_c()
        code, out = terminal.finish(timeout=120)
    finally:
        terminal.kill()
    said = " ".join(out.split())
    assert code == 130, out
    assert f"Ctrl-C: stopping {JOB} {PERIOD}. Subjects at a stage now" in said
    assert "EventsWorker" not in out and "Traceback" not in out
    with Ledger.connect(migrated) as ledger:
        runs = {r.subject: r for r in ledger.runs(job=JOB)}
    assert all(r.owner is None for r in runs.values()), runs
    if presses == 1:
        assert (runs["acme"].status, runs["globex"].status) == ("completed", "pending")
        assert f"stopped {JOB} {PERIOD}: 1 of 2 Run(s) completed" in said
    else:
        assert (runs["acme"].status, runs["globex"].status) == ("pending", "pending")
        assert "Ctrl-C again: released 1 Run(s) still at a stage" in said
