"""The local stack without Docker: its Supervisor leaves no process behind, and (with
RUNLEDGER_FULL=1) `runledger stack up` runs the reference job, delivers its mail and stops
cleanly on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deployments.project import load_deployments
from flows.deployment_check import with_every_job
from flows.jobs.competitor_summary import job as reference_job
from flows.jobs.competitor_summary import subscribers, workspaces
from flows.ports import free_port
from flows.stack import commands
from flows.stack.processes import Supervisor
from flows.stack.work_pool import DEFAULT_POOL
from tests.support.stack import wait_for_banner
from tests.support.waiting import wait_until

# A child that starts a grandchild in a session of its own (as Prefect's process worker starts
# flow runs), prints the grandchild's pid, and waits.
PARENT = textwrap.dedent("""
    import subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True)
    print(grandchild.pid, flush=True)
    time.sleep(600)
""")
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def grandchild_of(supervisor: Supervisor, name: str, grandchild_code: str) -> tuple[int, int]:
    child = supervisor.start(name, [sys.executable, "-c", PARENT, grandchild_code],
                             dict(os.environ))
    pid = wait_until(lambda: child.log_tail().strip(), 30, "the grandchild's pid")
    return child.pid, int(pid)


def test_stopping_sweeps_up_a_grandchild_that_ignores_sigterm_in_its_own_session(
        tmp_path: Path) -> None:
    """The child stops on SIGTERM; its grandchild (another session, SIGTERM ignored) is found
    by the stack tag and SIGKILLed."""
    supervisor = Supervisor(tmp_path, grace_seconds=5)
    child, grandchild = grandchild_of(supervisor, "parent", STUBBORN)
    assert set(supervisor.tagged()) == {child, grandchild}
    stragglers = supervisor.stop()
    assert stragglers == [grandchild]
    assert not alive(child) and not alive(grandchild) and supervisor.tagged() == []


def test_killing_a_child_kills_everything_it_started_at_once(tmp_path: Path) -> None:
    """kill() is a host dying: the child and its descendants in other sessions get SIGKILL."""
    supervisor = Supervisor(tmp_path)
    child, grandchild = grandchild_of(supervisor, "worker", "import time; time.sleep(600)")
    try:
        killed = supervisor.kill(supervisor.children[0])
        assert set(killed) == {child, grandchild}
        assert not alive(child) and not alive(grandchild)
    finally:
        supervisor.stop()


def test_children_are_terminated_when_the_stack_process_itself_is_killed(
        tmp_path: Path) -> None:
    """A SIGKILLed stack cannot clean up: its children get SIGTERM from the kernel instead."""
    stack = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from flows.stack.processes import Supervisor
        child = Supervisor(Path({str(tmp_path)!r})).start(
            "sleeper", [sys.executable, "-c", "import time; time.sleep(600)"], {{}})
        print(child.pid, flush=True)
        time.sleep(600)
    """)
    process = subprocess.Popen([sys.executable, "-c", stack], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    child = int(process.stdout.readline())
    assert alive(child)
    process.kill()
    process.wait()
    process.stdout.close()
    wait_until(lambda: not alive(child), 10, "the orphaned child to exit")


FULL = os.environ.get("RUNLEDGER_FULL") == "1"


@pytest.fixture
def stack_up(tmp_path: Path, request: pytest.FixtureRequest
             ) -> Iterator[tuple[subprocess.Popen[str], Path, int]]:
    """`runledger stack up` as `make run` starts it, in a folder of its own."""
    port = free_port()
    env = {**os.environ, "RUNLEDGER_DATABASE_URL": f"sqlite:///{tmp_path}/runledger.db"}
    env.pop("PREFECT_API_URL", None)
    kickoff = [] if request.param else ["--no-kickoff"]
    process = subprocess.Popen(
        commands.runledger_argv("stack", "up", "--home", str(tmp_path / "home"),
                                "--port", str(port), *kickoff),
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        yield process, tmp_path, port
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def processes_mentioning(text: str) -> list[int]:
    """Pids whose environment or command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            blob = (entry / "environ").read_bytes() + (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in blob and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def child_running(folder: Path, command: str) -> int:
    """The pid of the stack's child whose command line contains ``command``."""
    [found] = [pid for pid in processes_mentioning(str(folder))
               if command.encode() in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")]
    return found


def stop_with_ctrl_c(process: subprocess.Popen[str], folder: Path) -> None:
    os.kill(process.pid, signal.SIGINT)
    assert process.wait(60) == 0
    assert processes_mentioning(str(folder)) == []


@pytest.mark.parametrize("stack_up", [False], indirect=True, ids=["no-kickoff"])
def test_stack_up_serves_every_deployment_and_stops_cleanly_on_ctrl_c(
        stack_up: tuple[subprocess.Popen[str], Path, int]) -> None:
    """The UI answers, `runledger serve` registered every deployment of prefect.yaml with its
    schedules, the work pool exists for a team's `prefect deploy`; a second `stack up` is
    refused naming the running one and leaves it alone; the SMTP sink's death is reported
    and the rest runs on; a killed serve is started again; after SIGINT every process the
    stack started is gone."""
    process, folder, port = stack_up
    text = wait_for_banner(process)
    assert f"http://127.0.0.1:{port}" in text and str(folder / "home" / "mail") in text
    assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).status_code == 200
    api = f"http://127.0.0.1:{port}/api"
    expected = {spec.name: [s.slug for s in spec.schedules]
                for spec in with_every_job(load_deployments())}

    def served() -> dict[str, list[str]]:
        found = httpx.post(f"{api}/deployments/filter", json={}, timeout=10).json()
        return {d["name"]: [s["slug"] for s in d["schedules"] if s["active"]] for d in found}

    wait_until(lambda: served() == expected, 120, "serve to register every deployment")
    assert httpx.get(f"{api}/work_pools/{DEFAULT_POOL}", timeout=10).status_code == 200

    second = subprocess.run(
        commands.runledger_argv("stack", "up", "--home", str(folder / "home"), "--port",
                                str(free_port()), "--no-kickoff"),
        env={**os.environ, "RUNLEDGER_DATABASE_URL": f"sqlite:///{folder}/runledger.db"},
        cwd=folder, capture_output=True, text=True, timeout=120)
    assert second.returncode == 1, second.stdout + second.stderr
    said = "".join((second.stdout + second.stderr).split())  # Rich folds long lines anywhere
    assert "".join(f"already running from {folder / 'home'} (pid {process.pid}".split()) in said
    assert f"UIhttp://127.0.0.1:{port}" in said and "runledger.db" in said
    assert "stopping" not in said and process.poll() is None

    assert process.stdout is not None
    out = process.stdout
    os.kill(child_running(folder, " sink "), signal.SIGKILL)
    line = wait_until(lambda: next((x for x in iter(out.readline, "")
                                    if "SMTP sink exited" in x), None), 30, "the sink report")
    assert "the rest of the stack runs on" in line and "runledger sink --host" in line
    assert process.poll() is None

    serve = child_running(folder, " serve ")
    os.kill(serve, signal.SIGKILL)
    line = wait_until(lambda: next((x for x in iter(out.readline, "")
                                    if "serve exited" in x), None), 30, "the serve report")
    assert "serve exited (-9); started it again as pid" in line, line
    again = int(line.split(" as pid ")[1].split()[0])
    assert again != serve and alive(again) and process.poll() is None
    assert httpx.get(f"{api}/health", timeout=10).status_code == 200
    stop_with_ctrl_c(process, folder)


@pytest.mark.drill
@pytest.mark.skipif(not FULL, reason="full `make run` drill (about 80 s): RUNLEDGER_FULL=1")
@pytest.mark.parametrize("stack_up", [True], indirect=True, ids=["kickoff"])
def test_stack_up_runs_the_reference_job_delivers_mail_and_stops_cleanly_on_ctrl_c(
        stack_up: tuple[subprocess.Popen[str], Path, int]) -> None:
    """The README's main command: the reference job's Runs completed, one .eml per
    subscriber in the mail folder, then a clean stop on Ctrl-C."""
    process, folder, _ = stack_up
    wait_for_banner(process)
    recipients = sorted(r for s in workspaces() for r in subscribers(s))
    assert len(sorted((folder / "home" / "mail").glob("*.eml"))) == len(recipients)
    runs = json.loads(subprocess.run(
        commands.runledger_argv("runs", "list", "--job", reference_job.name, "--json"),
        cwd=folder, capture_output=True,
        text=True, check=True, env={**os.environ, "RUNLEDGER_DATABASE_URL":
                                    f"sqlite:///{folder}/runledger.db"}).stdout)
    # Only the reference job's: the stack serves every registered job, and another's Runs
    # (daily-credit's) may complete while this test reads.
    assert sorted(r["status"] for r in runs) == ["completed"] * len(workspaces()), \
        [(r["subject"], r["period"], r["status"]) for r in runs]
    stop_with_ctrl_c(process, folder)
