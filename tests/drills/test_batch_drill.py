"""The batch-mode kill drill (issue 48): M Runs of a one-call job in batch mode (the drill's own
job, tests/support/batch_drill.py: S subjects a day over M/S days, one email per Run) through
the real run-job and settle-batches flows, against a provider's Batch API on loopback (in this
process, each batch ending on its third retrieve) and the drills' PostgreSQL-backed Prefect
server: OpenAI's Files and Batches (bench/batch_provider.py's BatchServer) and Anthropic's
Message Batches (bench/anthropic_batch_provider.py's AnthropicBatchServer: the requests go with
the create, so ``after_batch_upload`` is passed without a request). Two submitters tick their
days in batch mode (each tick queues its calls and submits them as a batch) while two pollers
run settle-batches at the same time, so that they contend for the same batches' fenced leases.
Each process starts with a random fault point armed (``name@N``: die at its Nth passage), a
submitter one of the points a batch tick passes, a poller one of those a poll passes
(including those of submitting a batch a killed tick left open), until K kills have happened;
a killed process is restarted, then everything is polled until every Run completed. Both
ledgers, both providers. Reduced here (M=40, K=8); RUNLEDGER_FULL=1 runs M=1000, K=100. The
reduced form runs until its K kills (a submitter done early is given spare days), so a smaller
M does not shorten it: Anthropic's runs at the same size.

A batch's lease is 5 s and a Run's 3 s so that a killed holder's batch or Runs are taken over
soon: the lease length is not under test (a holder that outlives its lease is another drill).

Printed and asserted: Runs completed = M (plus S for each day a submitter is given when its own
are all finished while kills are still owed), none left waiting, duplicate completions 0;
every batch settled; each batch created once at the provider (OpenAI: per batch key one
``batches.create``; Anthropic, whose batches carry no key: each provider batch named by exactly
one ledger batch, none left unnamed), each request in one provider batch, each provider batch
holding the calls of the ledger batch naming it (a wrong adoption names another's); each Run's
call answered once (custom_ids unique, no call settled twice, paid per Run <= 1 + calls lost);
each answer's cost is the batch price and the batches' costs add up to the answered calls'; one
email per Run; the kills by point."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing.process import BaseProcess
from pathlib import Path

import pytest
import sqlalchemy as sa

from bench.anthropic_batch_provider import AnthropicBatchServer
from bench.batch_provider import BatchServer
from flows.prices import format_money
from flows.registry import upgrade_ledger
from flows.spend import spend_of
from store import (
    AFTER_BATCH_CREATE,
    AFTER_BATCH_FILE_COMMIT,
    AFTER_BATCH_INTENT_COMMIT,
    AFTER_BATCH_POLLED_COMMIT,
    AFTER_BATCH_SUBMITTED_COMMIT,
    AFTER_BATCH_UPLOAD,
    AFTER_CLAIM_BATCH_COMMIT,
    AFTER_FINISH_BATCH_COMMIT,
    AFTER_SETTLE_RESULTS_COMMIT,
    AFTER_WAIT_FOR_BATCH_COMMIT,
    MID_RESULTS_DOWNLOAD,
    Ledger,
)
from store.batch_tables import Batch, batches_table
from store.models import runs_table
from tests.support.armed import PRELOAD, run_armed
from tests.support.batch_drill import (
    BATCH_COST_NANOS,
    JOB,
    PRICES,
    SYNC_COST_NANOS,
    drill_job,
)
from tests.support.drill_periods import due_labels
from tests.support.ledger import model_calls
from tests.support.prefect_server import Server
from tests.support.waiting import Stall

FULL = os.environ.get("RUNLEDGER_FULL") == "1"


def runs_of(full: bool) -> int:
    """M, the Runs the batch drill asks for at either size."""
    return 1000 if full else 40


def kills_of(full: bool) -> int:
    """K, the kills the batch drill makes at either size."""
    return 100 if full else 8


def subjects_of(full: bool) -> int:
    """S, the subjects of a day: a day's tick submits a batch of S requests."""
    return 10 if full else 5


RUNS, KILLS, SUBJECTS = runs_of(FULL), kills_of(FULL), subjects_of(FULL)
SUBMITTERS = 2
POLLERS = 2  # at once: the second contends for the first's batches
SUBMIT_POINTS = (AFTER_WAIT_FOR_BATCH_COMMIT, AFTER_BATCH_INTENT_COMMIT, AFTER_BATCH_UPLOAD,
                 AFTER_BATCH_FILE_COMMIT, AFTER_BATCH_CREATE, AFTER_BATCH_SUBMITTED_COMMIT)
# A poll submits a batch a killed tick left open, so it passes the submit side's points too.
POLL_POINTS = (AFTER_CLAIM_BATCH_COMMIT, AFTER_BATCH_POLLED_COMMIT, MID_RESULTS_DOWNLOAD,
               AFTER_SETTLE_RESULTS_COMMIT, AFTER_FINISH_BATCH_COMMIT, AFTER_BATCH_UPLOAD,
               AFTER_BATCH_FILE_COMMIT, AFTER_BATCH_CREATE, AFTER_BATCH_SUBMITTED_COMMIT)
ARMED_POLLS = 30  # an armed poller whose point has not come by then exits for a new draw
POLLS_UNTIL_DONE = 2  # each batch answers in_progress twice, then ends
BATCH_LEASE_SECONDS = 5
# The drill fails when nothing moved (Runs, batches, kills) for this long: a stuck drill, while a
# busy machine only makes the whole drill longer (a loaded one took 333 s at the reduced size).
STALL_SECONDS = 240
TIMEOUT_SECONDS = 7200 if FULL else 1800  # pytest-timeout's, for a hang the loop cannot see
PROGRESS_SECONDS = 60
PROVIDERS = ("openai", "anthropic")  # RUNLEDGER_MODEL of each
FORKS = mp.get_context("forkserver")
FORKS.set_forkserver_preload(PRELOAD)

Provider = BatchServer | AnthropicBatchServer


@pytest.fixture(params=PROVIDERS)
def provider(request: pytest.FixtureRequest) -> Iterator[Provider]:
    """The Batch API of the provider named by the parameter, on loopback in this process."""
    server: Provider = BatchServer() if request.param == "openai" else AnthropicBatchServer()
    with server:
        server.polls_until_done = POLLS_UNTIL_DONE
        yield server


def model_of(server: Provider) -> str:
    """RUNLEDGER_MODEL for ``server``."""
    return "anthropic" if isinstance(server, AnthropicBatchServer) else "openai"


def requests_of(server: Provider) -> dict[str, list[str]]:
    """The custom_ids of each batch the provider created, by its id."""
    if isinstance(server, AnthropicBatchServer):
        return {i: [r["custom_id"] for r in b.requests] for i, b in server.batches.items()}
    return {i: [line["custom_id"] for line in b.lines] for i, b in server.batches.items()}


def creates(server: Provider, batches: list[Batch]) -> tuple[str, dict[str, object]]:
    """The provider's creates as the drill prints them, and what breaks "each batch created
    once" there (empty when kept). OpenAI's batches carry their key: per key one create, no key
    the ledger does not know. Anthropic's carry none: each provider batch named by exactly one
    ledger batch (none by two, none by none), and no ledger batch naming one never created."""
    wrong: dict[str, object]
    if isinstance(server, AnthropicBatchServer):
        named = Counter(b.provider_batch_id for b in batches if b.provider_batch_id)
        unnamed = [i for i in server.created if i not in named]
        unknown = sorted(set(named) - set(server.created))
        wrong = {"named twice": {i: n for i, n in named.items() if n > 1},
                 "unnamed": unnamed, "never created": unknown}
        line = (f"provider creates {len(server.created)}, ledger batches per provider batch "
                f"{dict(Counter(named[i] for i in server.created))}, unnamed {len(unnamed)}, "
                f"named yet never created {len(unknown)}, creates per request set "
                f"{dict(Counter(server.creates_by_requests.values()))}")
    else:
        unknown = sorted(set(server.creates_by_key) - {b.batch_key for b in batches})
        wrong = {"created twice": {k: n for k, n in server.creates_by_key.items() if n > 1},
                 "keys unknown to the ledger": unknown}
        line = (f"provider creates {sum(server.creates_by_key.values())} over "
                f"{len(server.creates_by_key)} keys, creates per key "
                f"{dict(Counter(server.creates_by_key.values()))}, keys unknown to the ledger "
                f"{len(unknown)}")
    return line, {what: found for what, found in wrong.items() if found}


def adopted_wrongly(batches: list[Batch], requests: dict[str, list[str]],
                    calls: list[dict[str, object]]) -> list[str]:
    """Each provider batch named by a ledger batch that did not settle the calls it holds (a
    wrong adoption), with the ledger batches involved."""
    settled_by = {c["custom_id"]: str(c["batch_key"]) for c in calls}
    named_by = {b.provider_batch_id: b for b in batches if b.provider_batch_id}
    wrong = []
    for provider_id, ids in requests.items():
        named, holders = named_by.get(provider_id), sorted({settled_by.get(i, "?") for i in ids})
        if named is not None and holders != [named.batch_key]:
            wrong.append(f"{provider_id} named by {named.batch_key} (fence {named.fence}, "
                         f"answered {named.answered}, requeued {named.requeued}) holds the "
                         f"calls of {', '.join(holders)}")
    return wrong


def drill_periods(full: bool, now: datetime) -> tuple[list[str], list[str]]:
    """The drill's days, all due at ``now``: M/S ending with the latest due one, and the spare
    days before them (newest first) that submitters are given while kills are still owed."""
    job, days = drill_job(subjects_of(full)), runs_of(full) // subjects_of(full)
    spare = due_labels(job, kills_of(full), now, skip=days)
    return due_labels(job, days, now), spare[::-1]


@dataclass
class Crew:
    """The drill's processes, what each has armed, and the kills so far."""

    env: dict[str, str]
    api: str
    slices: list[list[str]]  # each submitter's days
    spare: list[str]  # the days a submitter is given while kills are owed, newest first
    finished: Path  # the days the submitters finished, one a line
    stop: Path  # the pollers stop once it exists
    rng: random.Random
    running: dict[tuple[str, int], tuple[BaseProcess, str | None]] = field(default_factory=dict)
    kills: list[tuple[str, int, int, str]] = field(default_factory=list)  # kind, index, pid, point
    disarmed: set[int] = field(default_factory=set)  # pids this test killed itself
    arming: bool = True
    extra: list[str] = field(default_factory=list)  # days added while kills were owed

    def owed(self) -> int:
        """The Runs the drill asked for: M, plus S for each day added."""
        return RUNS + SUBJECTS * len(self.extra)

    def kills_owed(self) -> bool:
        return self.arming and len(self.kills) < KILLS

    def start(self, kind: str, index: int) -> None:
        points = SUBMIT_POINTS if kind == "submit" else POLL_POINTS
        point = (f"{self.rng.choice(points)}@{self.rng.randint(1, 3)}"
                 if self.kills_owed() else None)
        if kind == "submit":
            done = set(self.finished.read_text().split()) if self.finished.exists() else set()
            periods = [p for p in self.slices[index] if p not in done]
            if not periods and point is not None:
                # Kills still owed and this submitter's days all finished: a new day, since a
                # tick of a finished day passes no submit point.
                assert self.spare, "the batch drill used all its spare days: give it more"
                periods = [self.spare.pop(0)]
                self.extra.extend(periods)
                self.slices[index].extend(periods)
            if not periods:
                return
            args: tuple[str, ...] = ("tests.support.batch_drill:submitter", self.api,
                                     str(SUBJECTS), ",".join(periods), str(self.finished))
        else:
            args = ("tests.support.batch_drill:poller", self.api, str(SUBJECTS),
                    str(self.stop), str(ARMED_POLLS if point is not None else 0))
        process = FORKS.Process(target=run_armed, args=(point, self.env, *args))
        process.start()
        self.running[(kind, index)] = (process, point)

    def poll(self) -> None:
        """Restart the killed, and the pollers that ended before the stop; forget the
        submitters that finished their days."""
        for key, (process, point) in list(self.running.items()):
            if process.exitcode is None:
                continue
            code, pid = process.exitcode, process.pid
            process.close()
            del self.running[key]
            if code == -signal.SIGKILL:
                assert point is not None and pid is not None, key
                if pid not in self.disarmed:
                    self.kills.append((*key, pid, point))
                    print(f"kill {len(self.kills)}: {key[0]} {key[1]} pid {pid} at {point}",
                          flush=True)
                self.start(*key)
            else:
                assert code == 0, (key, code)
                if key[0] == "poll" and not self.stop.exists():
                    self.start(*key)  # its point never came: a new draw
                elif point is not None and self.kills_owed():
                    self.start(*key)  # its point never came: it gets a new day and point

    def disarm(self) -> None:
        """Arm nothing more, and replace the armed processes left: the work is done, and an
        armed poller could wait for its point for ever."""
        self.arming = False
        for process, point in self.running.values():
            if point is not None and process.pid is not None:
                self.disarmed.add(process.pid)
                process.kill()

    def submitting(self) -> bool:
        return any(kind == "submit" for kind, _ in self.running)

    def armed(self) -> bool:
        return any(point is not None for _, point in self.running.values())


@dataclass
class Standing:
    """The ledger's Runs of the drill's job and its batches, counted by status."""

    runs: Counter[str]
    batches: Counter[str]

    @classmethod
    def read(cls, ledger: Ledger) -> Standing:
        with ledger.engine.connect() as conn:
            runs = conn.execute(sa.select(runs_table.c.status, sa.func.count())
                                .where(runs_table.c.job == JOB)
                                .group_by(runs_table.c.status)).all()
            batches = conn.execute(sa.select(batches_table.c.status, sa.func.count())
                                   .group_by(batches_table.c.status)).all()
        return cls(Counter({s: n for s, n in runs}), Counter({s: n for s, n in batches}))

    def settled(self, owed: int) -> bool:
        """Every Run owed completed, and every batch settled."""
        return (self.runs["completed"] == owed == sum(self.runs.values())
                and set(self.batches) <= {"settled"})

    def line(self, owed: int) -> str:
        return (f"Runs {dict(sorted(self.runs.items()))} of {owed}, batches "
                f"{dict(sorted(self.batches.items()))}")


def test_random_sigkills_of_batch_submitters_and_pollers_settle_every_run_once(
        db_url: str, provider: Provider, drill_server: Server, tmp_path: Path) -> None:
    """After K kills at random batch fault points, every Run completes once, each batch is
    created once at the provider, and each call is answered and paid once."""
    periods, spare = drill_periods(FULL, datetime.now(UTC))
    stop = tmp_path / "stop"
    with Ledger.connect(db_url) as ledger:
        env = {"RUNLEDGER_DATABASE_URL": db_url, "RUNLEDGER_MODEL": model_of(provider),
               "RUNLEDGER_MODEL_BASE_URL": provider.base_url,
               "RUNLEDGER_MODEL_NAME": "probe-model", "RUNLEDGER_MODEL_API_KEY": "sk-test",
               "RUNLEDGER_MODEL_PRICES": json.dumps(PRICES), "RUNLEDGER_MODEL_CURRENCY": "USD",
               "RUNLEDGER_BATCH_LEASE_SECONDS": str(BATCH_LEASE_SECONDS),
               "RUNLEDGER_LEASE_SECONDS": "3", "RUNLEDGER_RETRY_DELAY_SECONDS": "0.05",
               "RUNLEDGER_TASK_RETRIES": "2"}
        upgrade_ledger(ledger)
        crew = Crew(env, drill_server.api,
                    [periods[i::SUBMITTERS] for i in range(SUBMITTERS)], spare,
                    tmp_path / "finished", stop, random.Random(48))
        began = shown = time.monotonic()
        try:
            for i in range(SUBMITTERS):
                crew.start("submit", i)
            for i in range(POLLERS):
                crew.start("poll", i)
            stall = Stall(STALL_SECONDS, "every Run completed and every batch settled", began)
            standing = Standing.read(ledger)
            while crew.submitting() or not standing.settled(crew.owed()) or crew.armed():
                stall.check(f"{standing.line(crew.owed())}, submitting {crew.submitting()}, "
                            f"{len(crew.kills)} kills", time.monotonic())
                if time.monotonic() - shown > PROGRESS_SECONDS:
                    print(f"progress after {time.monotonic() - began:.0f} s: "
                          f"{standing.line(crew.owed())}, {len(crew.kills)} kills", flush=True)
                    shown = time.monotonic()
                if not crew.submitting() and standing.settled(crew.owed()) and crew.arming:
                    crew.disarm()
                time.sleep(0.2)
                crew.poll()
                standing = Standing.read(ledger)
            stop.touch()
            for process, _ in crew.running.values():
                process.join(120)
            crew.poll()
        finally:
            stop.touch()
            for process, _ in crew.running.values():
                process.kill()
                process.join()
                process.close()
        report(ledger, provider, crew, time.monotonic() - began)


def report(ledger: Ledger, provider: Provider, crew: Crew, seconds: float) -> None:
    """Assert and print the drill's figures."""
    owed = crew.owed()
    runs = ledger.runs(job=JOB, limit=owed + 1)
    completed = [r for r in runs if r.status == "completed"]
    duplicates = sum(max(0, len([a for a in ledger.attempts(r.run_id)
                                 if a.outcome == "completed"]) - 1) for r in runs)
    calls = [c for c in model_calls(ledger) if c["job"] == JOB]
    of_run: dict[str, list[dict[str, object]]] = {}
    for c in calls:
        of_run.setdefault(str(c["run_id"]), []).append(c)
    answered = Counter(str(c["run_id"]) for c in calls if c["outcome"] == "answered")
    twice = {run_id: n for run_id, n in answered.items() if n > 1}
    broken = {run_id: [c["outcome"] for c in cs] for run_id, cs in of_run.items()
              if not spend_of(cs).keeps_invariant()}
    spend = spend_of(calls)
    batches = ledger.batches.list_batches(limit=100_000)
    created, wrong_creates = creates(provider, batches)
    requests = requests_of(provider)
    # Each request as the provider saw it: in how many of its batches a custom_id was.
    sent = Counter(custom_id for ids in requests.values() for custom_id in ids)
    misadopted = adopted_wrongly(batches, requests, calls)
    off_price = [c["call_id"] for c in calls if c["outcome"] == "answered"
                 and (c["cost_nanos"], c["sync_cost_nanos"]) != (BATCH_COST_NANOS,
                                                                 SYNC_COST_NANOS)]
    batch_cost = sum(b.cost_nanos or 0 for b in batches)
    outbox = ledger.outbox.messages(limit=owed + 1)
    per_run_mail = Counter(m.run_id for m in outbox)
    print(f"\n{ledger.dialect}, {model_of(provider)}: {len(crew.kills)} kills "
          f"({dict(Counter(kind for kind, *_ in crew.kills))}): "
          f"{dict(Counter(p.split('@')[0] for *_, p in crew.kills))}")
    added = (f" ({RUNS} + {owed - RUNS} for the days added while kills were owed)"
             if crew.extra else "")
    print(f"Runs completed {len(completed)} of {owed}{added}, statuses "
          f"{dict(Counter(r.status for r in runs))}, duplicate completions {duplicates}")
    print(f"batches {len(batches)} ({dict(Counter(b.status for b in batches))}), "
          f"{created}; requests sent per "
          f"custom_id {dict(Counter(sent.values()))}, provider batches named by a ledger batch "
          f"whose calls they do not hold {len(misadopted)}")
    for line in misadopted:
        print(f"  {line}")
    print(f"model calls {len(calls)} {dict(Counter(c['outcome'] for c in calls))}, answered "
          f"per Run {dict(Counter(answered.values()))}, calls settled twice {len(twice)}, "
          f"invariant (paid <= 1 + lost, per Run) broken for {len(broken)} Runs")
    print(f"cost {spend.money()} (batch price {format_money(BATCH_COST_NANOS, 'USD')} x "
          f"{sum(answered.values())} answered = "
          f"{format_money(BATCH_COST_NANOS * sum(answered.values()), 'USD')}; batches' "
          f"{format_money(batch_cost, 'USD')}; saved "
          f"{format_money(spend.batch_saved['USD'], 'USD')}); "
          f"emails {len(outbox)}; {seconds:.0f} s")
    assert len(crew.kills) >= KILLS
    assert len(runs) == len(completed) == owed and duplicates == 0
    assert set(Counter(b.status for b in batches)) == {"settled"}
    assert wrong_creates == {}, wrong_creates
    assert set(sent.values()) == {1} and len(sent) == len(calls), sent
    assert misadopted == [], misadopted
    assert twice == {} and broken == {}, (twice, broken)
    assert set(answered) == {r.run_id for r in runs} and set(answered.values()) == {1}
    assert {c["outcome"] for c in calls} == {"answered"}, Counter(c["outcome"] for c in calls)
    assert len({c["custom_id"] for c in calls}) == len(calls)
    assert off_price == [], off_price
    assert spend.cost == Counter({"USD": BATCH_COST_NANOS * len(calls)}), spend.cost
    assert batch_cost == BATCH_COST_NANOS * len(calls), batch_cost
    assert len(outbox) == owed and set(per_run_mail.values()) == {1}


pytestmark = [pytest.mark.drill, pytest.mark.timeout(TIMEOUT_SECONDS)]
