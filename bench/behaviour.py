"""runledger and the Prefect-native safe version of the same job, side by side, on the failures
scheduled AI jobs meet; prints one table.

    uv run python bench/behaviour.py [--scenarios all] [--systems runledger native-redis native-file]

Every run is a real process (``python bench/behaviour.py child ...``) of a one-subject job with
two recipients, against one Prefect server (PREFECT_API_URL, else a PostgreSQL-backed server of
the script's own), an SMTP sink of the script's own and, for runledger, a SQLite ledger. For each
scenario and system the table counts the model calls (runledger: its ledger; the baseline: a call log), the
outputs written (the job's validate, which both call exactly when they persist an output) and
the emails the sink accepted (and how many distinct Message-IDs). runledger's emails go through
its outbox: each runledger process runs one delivery pass after its tick.

Scenarios:
- twice: the same period run twice, one run after the other;
- concurrent: two runs of the same period at once (the model takes 2 s);
- kill-after-model: the first run is SIGKILLed right after the model answered; the next run
  starts once runledger's lease (3 s here) has expired and is given 40 s (--next-run-timeout);
- handoff-fails: the sink refuses the first try of every recipient (451), then a second run;
- handoff-crash: the process is SIGKILLed right after the sink accepted the first email, then a
  second run, given 40 s as above (runledger's delivery lease is 7 s here);
- recipients: the same key run again with a third recipient added;
- storage-deleted: the first run completes, its result and cache storage is deleted (what an
  expiring cache or a cleaned disk does), then a second run."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from prefect.client.schemas.objects import State

SCENARIOS = ["twice", "concurrent", "kill-after-model", "handoff-fails", "handoff-crash",
             "recipients", "storage-deleted"]
SYSTEMS = ["runledger", "native-redis", "native-file"]
RECIPIENTS = ["a@example.com", "b@example.com"]
NEXT_RUN_TIMEOUT = 40.0
LEASE_SECONDS = 3.0
DELIVERY_LEASE_SECONDS = 7.0


# --- the child process: one run of the job ------------------------------------------------------


def child(system: str, job_name: str, period: str, recipients: list[str], storage: Path,
          smtp_port: int) -> None:
    """One run of the job's tick for ``period`` by ``system`` (and, for runledger, one delivery
    pass); prints the flow's final state."""
    kill = os.environ.get("BEHAVIOUR_KILL", "")
    if kill == "handoff" and system == "runledger":
        # Read when store is first imported: set before any import of it.
        os.environ["RUNLEDGER_FAULTS"] = "after_send_before_mark"
    import asyncio

    from flows.jobs import Candidate, Job
    from flows.model import Model, OfflineModel
    from flows.registry import register
    from store import OutboxMessage, Period

    log = Path(os.environ["BEHAVIOUR_LOG"])

    def note(kind: str) -> None:
        with log.open("a") as out:
            out.write(json.dumps({"kind": kind, "pid": os.getpid()}) + "\n")

    def collect(subject: str, period: Period) -> dict[str, Any]:
        return {"subject": subject, "text": f"{subject} raised its prices on {period.label}. "
                "Customers were told by email. The change starts next month."}

    def transform(raw: dict[str, Any], model: Model) -> Candidate:
        answer = model.generate(raw["text"])
        if kill == "after-model":
            os.kill(os.getpid(), signal.SIGKILL)
        return Candidate(f"{answer.text} ({uuid.uuid4().hex[:6]})", answer.model)

    def validate(candidate: Candidate) -> None:
        note("output")
        assert candidate.text

    def messages(subject: str, period: Period, output: dict[str, Any]) -> list[OutboxMessage]:
        return [OutboxMessage(r, f"{subject} {period.label}", output["text"]) for r in recipients]

    job = register(Job(
        name=job_name, version="1", cadence="daily", timezone="UTC", subjects=["acme"],
        collect=collect, transform=transform, validate=validate, messages=messages,
        params=lambda subject, period: {"recipients": sorted(recipients)},
    ))
    delay = float(os.environ.get("BEHAVIOUR_MODEL_DELAY", "0"))
    if system == "runledger":
        from flows.delivery.dispatcher import Dispatcher
        from flows.run_job.flow import run_job
        from store import Ledger

        # Prefect types an async flow's call as an Awaitable; it is the coroutine asyncio.run takes.
        state = asyncio.run(cast("Coroutine[Any, Any, State[Any]]",
                                 run_job(job_name, period=period, return_state=True)))
        print(json.dumps({"state": state.name, "message": state.message}), flush=True)
        ledger = Ledger.connect()
        try:
            asyncio.run(Dispatcher.from_settings(ledger).run_pass(batch_size=10, max_seconds=10))
        finally:
            ledger.close()
        return
    from bench import prefect_native

    if kill == "handoff":
        original = prefect_native.send

        def send_then_die(smtp: tuple[str, int], messages: list[dict[str, str]]) -> None:
            original(smtp, messages[:1])
            os.kill(os.getpid(), signal.SIGKILL)

        prefect_native.send = send_then_die
    from bench.call_log import CallLog

    model = OfflineModel(delay_seconds=delay)
    native = prefect_native.native_flow(
        job, model, lock=system.removeprefix("native-"), storage=storage,
        smtp=("127.0.0.1", smtp_port), calls=CallLog(Path(os.environ["BEHAVIOUR_CALLS"])))
    # The same Awaitable typing of an async flow's call as above.
    state = asyncio.run(cast("Coroutine[Any, Any, State[int]]", native(period, return_state=True)))
    print(json.dumps({"state": state.name, "message": state.message}), flush=True)


# --- the parent: scenarios ----------------------------------------------------------------------


class Bench:
    """The shared pieces of every scenario: the Prefect server's URL, the sink, the ledger."""

    def __init__(self, api: str, directory: Path, next_run_timeout: float) -> None:
        from flows.mail.sink import Sink

        self.api = api
        self.next_run_timeout = next_run_timeout
        self.directory = directory
        self.sink = Sink().start()
        self.ledger_url = f"sqlite:///{directory / 'ledger.db'}"
        from store import Ledger

        Ledger.connect(self.ledger_url).migrate()

    def case(self, system: str, scenario: str) -> Case:
        return Case(self, system, scenario)

    def close(self) -> None:
        self.sink.stop()


class Case:
    """One scenario for one system: a fresh job name, call log, storage and a sink count."""

    def __init__(self, bench: Bench, system: str, scenario: str) -> None:
        self.bench = bench
        self.system = system
        self.scenario = scenario
        self.job = f"behaviour-{scenario}-{uuid.uuid4().hex[:6]}"
        self.home = bench.directory / self.job
        self.home.mkdir()
        self.storage = self.home / "storage"
        self.calls = self.home / "calls.jsonl"
        self.log = self.home / "log.jsonl"
        self.received = bench.sink.stats["received"]
        self.ids = {m.message_id for m in bench.sink.messages}
        self.notes: list[str] = []

    def env(self, **extra: str) -> dict[str, str]:
        env = {**os.environ, "PREFECT_API_URL": self.bench.api,
               "RUNLEDGER_DATABASE_URL": self.bench.ledger_url,
               "BEHAVIOUR_CALLS": str(self.calls),
               "BEHAVIOUR_LOG": str(self.log), "PREFECT_LOGGING_LEVEL": "ERROR",
               "PREFECT_LOCAL_STORAGE_PATH": str(self.storage / "prefect"),
               "RUNLEDGER_SMTP_HOST": "127.0.0.1", "RUNLEDGER_SMTP_PORT": str(self.bench.sink.port),
               "RUNLEDGER_SMTP_TLS": "none", "RUNLEDGER_SMTP_TIMEOUT": "1",
               "RUNLEDGER_MAIL_FROM": "runledger@example.com",
               "RUNLEDGER_LEASE_SECONDS": str(LEASE_SECONDS),
               "RUNLEDGER_DELIVERY_LEASE_SECONDS": str(DELIVERY_LEASE_SECONDS),
               "RUNLEDGER_DELIVERY_BASE_DELAY_SECONDS": "0.1",
               "RUNLEDGER_SUBJECT_CONCURRENCY": "1"}
        env.update(extra)
        return env

    def start(self, period: str = "2026-03-01", recipients: list[str] = RECIPIENTS,
              **extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, __file__, "child", self.system, self.job, period, ",".join(recipients),
             str(self.storage), str(self.bench.sink.port)],
            env=self.env(**extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finish(self, process: subprocess.Popen[str], timeout: float = 300) -> str:
        """Wait for ``process``; its final state, ``killed`` or ``blocked (Ns)``."""
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            outcome = f"blocked, stopped after {timeout:g} s"
        else:
            if process.returncode == -signal.SIGKILL:
                outcome = "killed"
            elif process.returncode != 0:
                outcome = f"exit {process.returncode}"
                print(f"{self.system} {self.scenario}: {err[-2000:]}", file=sys.stderr)
            else:
                lines = [x for x in out.splitlines() if x.startswith("{")]
                outcome = json.loads(lines[-1])["state"] if lines else "no state"
        self.notes.append(outcome)
        return outcome

    def run(self, timeout: float = 300, **options: Any) -> str:
        return self.finish(self.start(**options), timeout)

    def model_calls(self) -> int:
        """The calls that left: runledger's from its ledger, the baseline's from its log."""
        if self.system != "runledger":
            return len(self.calls.read_text().splitlines()) if self.calls.exists() else 0
        import sqlalchemy as sa

        from store import Ledger
        from store.call_tables import model_calls_table

        with Ledger.connect(self.bench.ledger_url) as ledger, ledger.engine.connect() as conn:
            return int(conn.execute(
                sa.select(sa.func.count()).select_from(model_calls_table)
                .where(model_calls_table.c.job == self.job)).scalar_one())

    def row(self) -> dict[str, Any]:
        time.sleep(0.5)  # the sink's last reply is counted after the client has its answer
        messages = [m for m in self.bench.sink.messages if m.message_id not in self.ids]
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return {"scenario": self.scenario, "system": self.system, "model_calls": self.model_calls(),
                "outputs": sum('"output"' in x for x in lines),
                "emails": self.bench.sink.stats["received"] - self.received,
                "distinct": len({m.message_id for m in messages}), "runs": " / ".join(self.notes)}


def scenario(case: Case) -> dict[str, Any]:
    name = case.scenario
    if name == "twice":
        case.run()
        case.run()
    elif name == "concurrent":
        both = [case.start(BEHAVIOUR_MODEL_DELAY="2", RUNLEDGER_OFFLINE_MODEL_DELAY_SECONDS="2")
                for _ in range(2)]
        for process in both:
            case.finish(process)
    elif name == "kill-after-model":
        extra: dict[str, Any] = {"RUNLEDGER_FAULTS": "after_model_answer"} if case.system == "runledger" \
            else {"BEHAVIOUR_KILL": "after-model"}
        case.run(**extra)
        time.sleep(LEASE_SECONDS + 1)
        case.run(timeout=case.bench.next_run_timeout)
    elif name == "handoff-fails":
        from flows.mail.sink import Fault

        refuse = Fault("rcpt", "451", times=None)
        case.bench.sink.handler._faults.append(refuse)
        case.run()
        case.bench.sink.handler._faults.remove(refuse)
        case.run()
    elif name == "handoff-crash":
        case.run(BEHAVIOUR_KILL="handoff")
        time.sleep(DELIVERY_LEASE_SECONDS + 1)
        case.run(timeout=case.bench.next_run_timeout)
    elif name == "recipients":
        case.run()
        case.run(recipients=[*RECIPIENTS, "c@example.com"])
    elif name == "storage-deleted":
        case.run()
        shutil.rmtree(case.storage, ignore_errors=True)
        case.run()
    else:
        raise SystemExit(f"unknown scenario {name!r}")
    return case.row()


@contextmanager
def prefect_api() -> Iterator[str]:
    if os.environ.get("PREFECT_API_URL"):
        yield os.environ["PREFECT_API_URL"]
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from bench.pipeline_bench import own_server

    with own_server(0) as api:
        yield api


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| scenario | system | model calls | outputs written | emails accepted (distinct) "
             "| runs |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['system']} | {r['model_calls']} | {r['outputs']} | "
                     f"{r['emails']} ({r['distinct']}) | {r['runs']} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        system, job, period, recipients, storage, port = sys.argv[2:8]
        sys.path.insert(0, str(Path(__file__).parent))
        child(system, job, period, recipients.split(","), Path(storage), int(port))
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", default=SCENARIOS, choices=SCENARIOS)
    parser.add_argument("--systems", nargs="+", default=SYSTEMS, choices=SYSTEMS)
    parser.add_argument("--next-run-timeout", type=float, default=NEXT_RUN_TIMEOUT,
                        help="seconds the run after a kill is given before it counts as blocked")
    args = parser.parse_args()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="runledger-behaviour-"))
    print(f"behaviour: {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, "
          f"{len(RECIPIENTS)} recipients per run", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="runledger-behaviour-") as directory, \
            prefect_api() as api:
        bench = Bench(api, Path(directory), args.next_run_timeout)
        try:
            for name in args.scenarios:
                for system in args.systems:
                    rows.append(scenario(bench.case(system, name)))
                    print(json.dumps(rows[-1]), flush=True)
        finally:
            bench.close()
    print(table(rows), flush=True)


if __name__ == "__main__":
    main()
