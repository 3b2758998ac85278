"""Drill 1, SIGKILL at random fault points: M Runs of the reference job (competitor-summary's two
workspaces over the M/2 days up to the latest due one, under the drill's own job name with a
budget per period, calling a priced model that bills each call its bound: cap_probe's
BillingServer) through the real run-job flow in four tick worker processes, against
the drills' PostgreSQL-backed Prefect server (tests/support/prefect_server.py), while two
dispatchers deliver at the same time. Each process starts with a random fault point armed
(``name@N``: die at its Nth passage, N up to 3 for a tick worker, 12 for a dispatcher) until K
kills have happened; a killed process is restarted, then everything is allowed to finish. Both ledgers. Reduced here (M=50, K=10); RUNLEDGER_FULL=1 runs
M=1000, K=100.

Printed and asserted: Runs completed = M (plus two for each period a worker is given when
its own are all finished while kills are still owed: a Duplicate tick passes no fault point),
duplicate completions 0, model calls per Run (more
than one only for Runs that a killed worker had asked the model about, each listed), the spend
invariant per Run (calls paid <= 1 + calls lost), the budget per period (each window holds
what its calls were charged, never more than its cap, nothing refused), outbox
rows as expected, unique Message-IDs at the sink = outbox rows, raw duplicates only for messages
with an attempt whose outcome a kill took (each listed with its Message-ID), 0 lost."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing.process import BaseProcess
from pathlib import Path

import pytest

from flows.jobs.competitor_summary import subscribers
from flows.mail.letter import message_id_for
from flows.mail.sink import Sink
from flows.prices import format_money, nanos
from flows.registry import upgrade_ledger
from flows.spend import spend_of
from store import Ledger, Run
from store.faults import (
    AFTER_CALL_INTENT_COMMIT,
    AFTER_CHECKPOINT_COMMIT,
    AFTER_CLAIM_MESSAGES_COMMIT,
    AFTER_COMPLETE_COMMIT,
    AFTER_MARK_SENT_COMMIT,
    AFTER_MODEL_ANSWER,
    AFTER_REGISTER_AND_CLAIM_COMMIT,
    AFTER_RENEW_MANY_COMMIT,
    AFTER_SAVE_INPUT_COMMIT,
    AFTER_SEND_BEFORE_MARK,
)
from tests.support import cap_probe
from tests.support.armed import PRELOAD, run_armed
from tests.support.cap_probe import BillingServer
from tests.support.drill_periods import due_labels
from tests.support.kill_drill import CALL_ESTIMATE, JOB, drill_job
from tests.support.ledger import model_calls
from tests.support.pipeline import copy_sample_data
from tests.support.prefect_server import Server
from tests.support.waiting import Stall

FULL = os.environ.get("RUNLEDGER_FULL") == "1"


def runs_of(full: bool) -> int:
    """M, the Runs drill 1 asks for at either size."""
    return 1000 if full else 50


def kills_of(full: bool) -> int:
    """K, the kills drill 1 makes at either size."""
    return 100 if full else 10


def drill_periods(full: bool, now: datetime) -> tuple[list[str], list[str]]:
    """Drill 1's days, all due at ``now``: M/2 ending with the latest due one, and the spare
    days before them (newest first) that workers are given while kills are still owed, two
    per kill (a run that used them all fails saying so)."""
    job, days = drill_job(kills_of(full)), runs_of(full) // 2
    spare = due_labels(job, 2 * kills_of(full), now, skip=days)
    return due_labels(job, days, now), spare[::-1]


RUNS = runs_of(FULL)
KILLS = kills_of(FULL)
WORKERS = 4
DISPATCHERS = 2
TICK_POINTS = (AFTER_REGISTER_AND_CLAIM_COMMIT, AFTER_RENEW_MANY_COMMIT, AFTER_SAVE_INPUT_COMMIT,
               AFTER_CALL_INTENT_COMMIT, AFTER_MODEL_ANSWER, AFTER_CHECKPOINT_COMMIT,
               AFTER_COMPLETE_COMMIT)
DELIVERY_POINTS = (AFTER_CLAIM_MESSAGES_COMMIT, AFTER_SEND_BEFORE_MARK, AFTER_MARK_SENT_COMMIT)
# The drill fails when nothing moved (the outbox's counts, the kills) for this long: a stuck
# drill, while a busy machine only makes the whole drill longer.
STALL_SECONDS = 240
TIMEOUT_SECONDS = 7200 if FULL else 1800  # pytest-timeout's, for a hang the loop cannot see
PROGRESS_SECONDS = 300  # a full-size run stopped early still shows how far it came
FORKS = mp.get_context("forkserver")
FORKS.set_forkserver_preload(PRELOAD)


@dataclass
class Crew:
    """The drill's processes, what each has armed, and the kills so far."""

    env: dict[str, str]
    api: str
    slices: list[list[str]]  # each tick worker's periods
    spare: list[str]  # the periods a worker is given while kills are owed, newest first
    finished: Path  # the periods the tick workers finished, one a line
    dispatch: tuple[str, ...]
    rng: random.Random
    running: dict[tuple[str, int], tuple[BaseProcess, str | None]] = field(default_factory=dict)
    kills: list[tuple[str, int, int, str]] = field(default_factory=list)  # kind, index, pid, point
    disarmed: set[int] = field(default_factory=set)  # pids this test killed itself
    arming: bool = True
    extra: list[str] = field(default_factory=list)  # periods added while kills were owed

    def owed(self) -> int:
        """The Runs the drill asked for: M, plus two for each period added."""
        return RUNS + 2 * len(self.extra)

    def kills_owed(self) -> bool:
        return self.arming and len(self.kills) < KILLS

    def start(self, kind: str, index: int) -> None:
        # A dispatcher passes its points several times a second: a later passage spreads its
        # kills over the drill instead of spending them all at the start.
        points, nth = (TICK_POINTS, 3) if kind == "tick" else (DELIVERY_POINTS, 12)
        point = (f"{self.rng.choice(points)}@{self.rng.randint(1, nth)}"
                 if self.kills_owed() else None)
        if kind == "tick":
            # A restarted worker goes on where its predecessor stopped, as the next scheduled
            # tick would: ticking every finished period again made the full size quadratic.
            done = set(self.finished.read_text().split()) if self.finished.exists() else set()
            periods = [p for p in self.slices[index] if p not in done]
            if not periods and point is not None:
                # Kills still owed and this worker's periods all finished: a new period, since
                # a Duplicate tick passes no fault point (the reduced size still reaches K).
                assert self.spare, "drill 1 used all its spare periods: give drill_periods more"
                periods = [self.spare.pop(0)]
                self.extra.extend(periods)
                self.slices[index].extend(periods)
            if not periods:
                return
            args: tuple[str, ...] = ("tests.support.kill_drill:tick_worker", self.api,
                                     str(KILLS), ",".join(periods), str(self.finished))
        else:
            args = ("tests.support.kill_drill:dispatcher", *self.dispatch)
        process = FORKS.Process(target=run_armed, args=(point, self.env, *args))
        process.start()
        self.running[(kind, index)] = (process, point)

    def poll(self) -> None:
        """Restart the killed; forget the tick workers that finished their periods."""
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
                if point is not None and self.kills_owed():
                    self.start(*key)  # its point never came: it gets a new period and point

    def disarm(self) -> None:
        """Arm nothing more, and replace the armed processes left: the work is done, and an
        armed dispatcher could wait for its point for ever."""
        self.arming = False
        for process, point in self.running.values():
            if point is not None and process.pid is not None:
                self.disarmed.add(process.pid)
                process.kill()

    def ticking(self) -> bool:
        return any(kind == "tick" for kind, _ in self.running)

    def armed(self) -> bool:
        return any(point is not None for _, point in self.running.values())


def progress(ledger: Ledger, crew: Crew, began: float) -> None:
    completed = len(ledger.runs(job=JOB, status="completed", limit=crew.owed()))
    print(f"progress after {time.monotonic() - began:.0f} s: Runs completed {completed} of "
          f"{crew.owed()}, outbox {ledger.outbox.message_counts()}, {len(crew.kills)} kills "
          f"{dict(Counter(p.split('@')[0] for *_, p in crew.kills))}", flush=True)


def unsettled(ledger: Ledger) -> bool:
    counts = {k: v for k, v in ledger.outbox.message_counts().items() if v}
    return set(counts) != {"sent"}


def test_random_sigkills_across_workers_and_dispatchers_lose_nothing_and_duplicate_nothing(
        db_url: str, drill_server: Server, tmp_path: Path) -> None:
    """After K kills at random points and restarts, every Run is completed once, every message
    is sent, and each extra model call or sink copy is one a kill explains."""
    periods, spare = drill_periods(FULL, datetime.now(UTC))
    stop = tmp_path / "stop"
    env = {"RUNLEDGER_DATABASE_URL": db_url,
           "RUNLEDGER_COMPETITOR_SUMMARY_SOURCE": str(copy_sample_data(tmp_path / "source")),
           "RUNLEDGER_LEASE_SECONDS": "3", "RUNLEDGER_RETRY_DELAY_SECONDS": "0.05",
           "RUNLEDGER_TASK_RETRIES": "2"}
    with Ledger.connect(db_url) as ledger, Sink() as sink, BillingServer() as model:
        # A priced model that bills every call its bound: the budget is judged in money.
        env |= {f"RUNLEDGER_{k.upper()}": str(v) for k, v in cap_probe.settings().items()}
        env |= {"RUNLEDGER_MODEL": "openai", "RUNLEDGER_MODEL_BASE_URL": model.base_url}
        upgrade_ledger(ledger)
        crew = Crew(env, drill_server.api, [periods[i::WORKERS] for i in range(WORKERS)],
                    spare, tmp_path / "finished",
                    (db_url, sink.host, str(sink.port), str(stop)), random.Random(24))
        try:
            for i in range(WORKERS):
                crew.start("tick", i)
            for i in range(DISPATCHERS):
                crew.start("deliver", i)
            began = shown = time.monotonic()
            stall = Stall(STALL_SECONDS, "every Run completed and every message sent", began)
            while crew.ticking() or unsettled(ledger) or crew.armed():
                stall.check(f"outbox {sorted(ledger.outbox.message_counts().items())}, "
                            f"kills {crew.kills}",
                            time.monotonic())
                if time.monotonic() - shown > PROGRESS_SECONDS:
                    progress(ledger, crew, began)
                    shown = time.monotonic()
                if not crew.ticking() and not unsettled(ledger) and crew.arming:
                    crew.disarm()
                time.sleep(0.1)
                crew.poll()
            stop.touch()
            for process, _ in crew.running.values():
                process.join(60)
            crew.poll()
        finally:
            for process, _ in crew.running.values():
                process.kill()
                process.join()
                process.close()
        report(ledger, sink, crew)


@dataclass
class BudgetJudgement:
    """Invariant 12 in money, per period: each budget window against its calls."""

    windows: int
    cap: int  # billionths of USD, every window's
    most: int  # the most a window holds, spent and reserved together
    exceeded: list[str]  # windows holding more than their cap
    unaccounted: dict[str, tuple[int, int]]  # window: (held, what its calls were charged)
    estimates: set[int]  # what the calls reserved
    refused: int  # calls the budget refused

    def line(self) -> str:
        return (f"budget: {self.windows} period windows of cap {format_money(self.cap, 'USD')}, "
                f"most held {format_money(self.most, 'USD')}, exceeded {len(self.exceeded)}, "
                f"not matching their calls {len(self.unaccounted)}, calls refused "
                f"{self.refused}")

    def check(self) -> None:
        # A call's bound above CALL_ESTIMATE (larger sample documents) would reserve more,
        # and the cap could refuse a Run: raise CALL_ESTIMATE in tests/support/kill_drill.py.
        assert self.estimates <= {nanos(CALL_ESTIMATE)}, self.estimates
        assert self.exceeded == [] and self.unaccounted == {} and self.refused == 0, self


def judge_budget(ledger: Ledger, runs: list[Run], recorded: list[dict[str, object]]
                 ) -> BudgetJudgement:
    """Each period's window holds (spent and reserved) what its calls were charged, never more
    than its cap: an answer its price, a call lost in flight or left without an outcome by a
    kill the estimate it reserved, a failed or refused one nothing."""
    charged: Counter[datetime] = Counter()
    estimates = set()
    for c in recorded:
        period, estimate, cost = c["budget_period"], c["estimate"], c["cost_nanos"]
        assert isinstance(period, datetime) and isinstance(estimate, int), c
        estimates.add(estimate)
        if c["outcome"] == "answered":
            assert isinstance(cost, int), c
            charged[period] += cost
        elif c["outcome"] in (None, "lost"):
            charged[period] += estimate
    since = min(r.period_start for r in runs)
    windows = [w for w in ledger.calls.budget_windows(JOB, since) if w.scope == "period"]
    held = {w.window_start: w.spent + w.reserved for w in windows}
    return BudgetJudgement(
        len(windows), max(w.cap for w in windows), max(held.values()),
        [w.window_start.isoformat() for w in windows if held[w.window_start] > w.cap],
        {start.isoformat(): (n, charged[start]) for start, n in held.items()
         if n != charged[start]},
        estimates, sum(w.refused for w in windows))


def report(ledger: Ledger, sink: Sink, crew: Crew) -> None:
    """Assert and print the drill's figures."""
    owed = crew.owed()
    runs = ledger.runs(job=JOB, limit=owed + 1)
    completed = [r for r in runs if r.status == "completed"]
    completers: dict[str, int] = {}  # run id -> pid of the worker whose attempt completed it
    duplicates = 0
    for r in runs:
        done = [a for a in ledger.attempts(r.run_id) if a.outcome == "completed"]
        duplicates += max(0, len(done) - 1)
        if done:
            completers[r.run_id] = int(done[0].owner.split(":")[1])  # owner is host:pid:...
    killed = {pid: point for kind, _, pid, point in crew.kills if kind == "tick"}
    callers: dict[str, list[int]] = {}
    of_run: dict[str, list[dict[str, object]]] = {}
    recorded = model_calls(ledger)
    for entry in recorded:
        callers.setdefault(str(entry["run_id"]), []).append(int(entry["pid"]))
        of_run.setdefault(str(entry["run_id"]), []).append(entry)
    spend = spend_of(recorded)
    # The invariant, per Run: calls paid <= the calls of one transform (1) + calls lost. Every
    # worker has ended: a call still without an outcome is a killed worker's, lost.
    broken = {run_id: [c["outcome"] for c in calls] for run_id, calls in of_run.items()
              if not spend_of(calls).keeps_invariant()}
    budget = judge_budget(ledger, runs, recorded)
    per_run = {run_id: len(pids) for run_id, pids in callers.items()}
    again = {run_id: pids for run_id, pids in callers.items() if len(pids) > 1}
    expected_rows = sum(len(subscribers(r.subject)) for r in runs)
    messages = ledger.outbox.messages(limit=expected_rows + 1)
    copies = Counter(m.message_id for m in sink.messages)
    resent = {}
    for m in messages:
        n = copies[message_id_for(m.message_id)]
        if n > 1:
            resent[m.message_id] = n
            lost = m.attempts - len(ledger.outbox.delivery_attempts(m.message_id))
            assert n - 1 <= lost, (m.message_id, n, lost)
    print(f"\n{ledger.dialect}: {len(crew.kills)} kills "
          f"({Counter(kind for kind, *_ in crew.kills)}): "
          f"{Counter(p.split('@')[0] for *_, p in crew.kills)}")
    added = f" ({RUNS} + {owed - RUNS} for the periods added while kills were owed)" if crew.extra else ""
    print(f"Runs completed {len(completed)} of {owed}{added}, duplicate completions {duplicates}, "
          f"model calls per Run {dict(sorted(Counter(per_run.values()).items()))}")
    print(f"model calls paid {spend.paid + spend.in_flight}, lost in flight "
          f"{spend.lost + spend.in_flight} ({spend.in_flight} of them with no outcome: never "
          f"marked lost), failed {spend.failed}, reused from a checkpoint {spend.reused}; "
          f"invariant (paid <= 1 + lost, per Run) broken for {len(broken)} Runs; "
          f"cost {spend.money()}")
    print(budget.line())
    for run_id, pids in sorted(again.items()):
        others = [f"pid {p} killed at {killed.get(p)}" for p in pids if p != completers.get(run_id)]
        print(f"  Run {run_id[:12]}: {len(pids)} model calls; completed by pid "
              f"{completers.get(run_id)}; the others' answers lost: {', '.join(others)}")
    print(f"outbox rows {len(messages)} (expected {expected_rows}), statuses "
          f"{ledger.outbox.message_counts()}, sink: {sum(copies.values())} received, {len(copies)} "
          f"unique Message-IDs")
    for key, n in sorted(resent.items()):
        print(f"  resent after a kill: {message_id_for(key)} x{n}")
    assert len(crew.kills) >= KILLS
    assert broken == {}, broken
    budget.check()
    assert spend.paid == len(recorded) - spend.refused - spend.in_flight
    assert len(runs) == len(completed) == owed and duplicates == 0
    # The completing worker called the model once; every other call was made by a worker that
    # was killed before it could commit that Run's completion.
    # Or called it not at all, replaying the answer a killed worker had checkpointed.
    for run_id, pids in callers.items():
        own = pids.count(completers[run_id])
        reused = sum(c["reuses"] for c in recorded if c["run_id"] == run_id)
        assert own == 1 or (own == 0 and reused >= 1), (run_id, pids, reused)
        assert all(p in killed for p in pids if p != completers[run_id]), (run_id, pids, killed)
    assert len(messages) == expected_rows
    assert {m.status for m in messages} == {"sent"}  # 0 lost
    assert len(copies) == len(messages)


pytestmark = [pytest.mark.drill, pytest.mark.timeout(TIMEOUT_SECONDS)]
