"""Every benchmark script runs here in a reduced form, on both ledgers, so that a change which
breaks one fails the suite instead of surprising the next person who measures. The figures are
not asserted (no timed tests): the full runs and their figures are in docs/benchmarks.md. What a
script checks about behaviour (one winner per contended claim, a rerun with no model call and no
task run, every message delivered) is asserted through its exit status and its output."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from deployments.project import PROJECT_ROOT

# A bench's subprocess may take up to its own 600 s bound on a loaded machine: the test's
# timeout leaves room for it.
pytestmark = [pytest.mark.processes, pytest.mark.timeout(900)]

BENCH = PROJECT_ROOT / "bench"

RunBench = Callable[..., str]


@pytest.fixture
def run_bench(postgres_databases: Any) -> RunBench:
    """Run ``bench/<script>`` to the end against the tests' PostgreSQL server (without it the
    fixture fails in CI) and return what it printed; it must exit 0 and must not have skipped
    PostgreSQL."""
    admin = postgres_databases.engine.url.render_as_string(hide_password=False)

    def run(script: str, *args: str, timeout: float = 600, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            [sys.executable, str(BENCH / script), *args], cwd=PROJECT_ROOT,
            env={**os.environ, "RUNLEDGER_BENCH_POSTGRES_URL": admin, **(env or {})},
            capture_output=True, text=True, timeout=timeout,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "unreachable" not in done.stdout, done.stdout
        return done.stdout

    return run


def bench_databases(postgres_databases: Any, prefix: str) -> int:
    with postgres_databases.engine.connect() as conn:
        return int(conn.execute(sa.text(
            "SELECT count(*) FROM pg_database WHERE starts_with(datname, :prefix)"),
            {"prefix": prefix + "_"}).scalar_one())


def test_the_ledger_bench_counts_each_procedures_round_trips_and_finds_one_winner_per_claim(
        run_bench: RunBench) -> None:
    """The hand-written baseline's Run takes 7 round trips and the ledger's 3, locally and one
    hop away."""
    out = run_bench("ledger_bench.py", "--seconds", "0.6", "--workers", "2", "--rounds", "3",
                    "--account-runs", "10")
    for label in ("", r" \[one hop away, \+0\.5 ms each way\]"):
        assert re.search(rf"\[postgresql\]{label} ratio ledger Runs/s : baseline Runs/s = \d+\.\d\d "
                         r"\((meets|BELOW) the \d\.0 target\); client CPU per Run ledger : baseline = "
                         r"\d+\.\d\d", out), out
    # The wire counts are exact: the baseline's register, claim, input and (BEGIN, completion,
    # outbox, COMMIT) against the ledger's three statements; rows and WAL from the WAL itself.
    assert re.search(r"\[postgresql\]   baseline  \|         7\.0 \|        5\.0 \|          2\.0 \|",
                     out), out
    for procedure in ("ledger", "replay"):
        assert re.search(rf"\[postgresql\]   {procedure:9} \|         3\.0 \|        3\.0 \|"
                         r"          0\.0 \| +\d+\.\d \| +\d+\.\d \| +\d+\.\d \| +\d+\.\d \|", out), out
    assert "[sqlite] ledger, register_and_claim + save_input + complete with 1 outbox row: " in out
    for dialect in ("postgresql", "sqlite"):
        assert f"[{dialect}] contention, 2 processes x 3 rounds on 1 key each: exactly 1 winner " \
               "in every round" in out, out


def test_the_delivery_bench_delivers_every_message_on_both_ledgers(run_bench: RunBench) -> None:
    out = run_bench("delivery_bench.py", "--messages", "20", "--repeat", "1")
    for dialect in ("sqlite", "postgresql"):
        assert re.search(rf"dispatcher on {dialect}\s+\(claim, send, mark\): median\s+\d+ msg/s",
                         out), out


def test_the_outbox_claim_bench_compares_a_backlog_with_a_small_outbox_on_both_ledgers(
        run_bench: RunBench) -> None:
    out = run_bench("outbox_claim_bench.py", "--backlog", "500", "--small", "100", "--claims", "3")
    for dialect in ("postgres", "sqlite"):
        assert re.search(rf"{dialect}\s*: 100 due -> [\d.]+ ms per claim; 500 due -> [\d.]+ ms per "
                         r"claim; ratio \d+\.\d\d", out), out


def test_the_batch_price_bench_meets_its_targets_on_both_ledgers(run_bench: RunBench) -> None:
    """Reduced (4 subjects, a provider that answers at the second poll): batch mode costs half
    the synchronous tick on each ledger, one create per batch key, one answered call per Run,
    every Run completed."""
    out = run_bench("batch_price.py", "--subjects", "4", "--polls", "1", "--poll-interval",
                    "0.1", "--dialects", "sqlite", "postgres")
    for dialect in ("sqlite", "postgres"):
        assert f"{dialect:8} N=4: cost ratio batch : synchronous 0.5000" in out, out
        assert f"{dialect:8} N=4: creates per batch key [1] (target [1]): met" in out, out
        assert f"{dialect:8} N=4: Runs completed 8 of 8: met" in out, out
    assert "MISSED" not in out


def test_the_pipeline_bench_reruns_a_completed_tick_without_model_calls_or_task_runs(
        run_bench: RunBench, postgres_databases: Any) -> None:
    """Only Prefect-native's rerun creates task runs (cached); neither calls a model again."""
    # A prefix of its own: the other benchmarks' tests may run beside it.
    prefix = f"rlbench_{uuid.uuid4().hex[:6]}"
    out = run_bench("pipeline_bench.py", "--server", "--sizes", "3", "--dialects", "sqlite",
                    timeout=600, env={"RUNLEDGER_BENCH_DATABASE_PREFIX": prefix})
    assert re.search(r"Prefect server: http://127\.0\.0\.1:\d+/api \(PostgreSQL, nice 10\)", out)
    # The server's database work is its background work too: its backends ran niced as well.
    reniced = re.search(rf"The server's database {prefix}_\w+: (\d+) PostgreSQL backends kept "
                        r"at nice 10", out)
    assert reniced is not None and int(reniced[1]) >= 1, out
    head = "sqlite   N=    3:"
    # One round: each ratio is printed with its range; the verdicts need five rounds (their
    # interval is tested below).
    ratio = r"\d+\.\d{3} \(\d+\.\d{3}-\d+\.\d{3}\)"
    assert re.search(rf"{head} run_job : bare, client CPU {ratio}; wall \d+\.\d{{3}}", out), out
    for lock in ("redis", "file"):
        assert re.search(rf"{head} run_job : Prefect-native \({lock} locks\), client CPU "
                         rf"{ratio}; wall \d+\.\d{{3}}", out), out
        assert re.search(rf"{head} rerun speed-up over Prefect-native \({lock} locks\), wall "
                         rf"{ratio}", out), out
    # run_job's rerun calls no model and starts no task run (its first run: one
    # register+claim task run and three per subject); Prefect-native's calls no model and
    # sends no email, but creates 3 cached task runs per subject.
    rerun = next(x for x in out.splitlines() if x.startswith(f"{head} rerun of the completed"))
    assert "run_job 0.00 s CPU" not in rerun  # a measured time, not a skipped step
    assert re.search(r"run_job [\d.]+ s CPU / [\d.]+ s wall with 0 model calls, 0 emails and 0 "
                     r"task runs", rerun), rerun
    for lock in ("redis", "file"):
        assert re.search(rf"native_{lock} [\d.]+ s CPU / [\d.]+ s wall with 0 model calls, 0 "
                         r"emails and 9 task runs", rerun), rerun
    assert "(run_job's first run: 10 task runs)" in rerun, rerun
    # The databases of the script's own server and of its PostgreSQL ledger are dropped.
    assert bench_databases(postgres_databases, prefix) == 0


def test_the_behaviour_table_shows_a_kill_after_the_model_blocking_prefect_native_not_runledger(
        run_bench: RunBench, prefect_api: str) -> None:
    """After a kill, runledger's next run finishes the Run; Prefect-native's waits on a lock."""

    def row(system: str, wait: str) -> dict[str, Any]:
        out = run_bench("behaviour.py", "--scenarios", "kill-after-model", "--systems", system,
                        "--next-run-timeout", wait, env={"PREFECT_API_URL": prefect_api},
                        timeout=600)
        assert "| scenario | system | model calls | outputs written | emails accepted" in out
        [found] = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
        return dict(found)

    # The run after the kill gets time enough to finish (runledger's does not wait for a lock;
    # a loaded machine only slows it), and Prefect-native's would wait for ever.
    killed = row("runledger", "300")
    assert (killed["model_calls"], killed["outputs"], killed["emails"]) == (2, 1, 2), killed
    assert killed["runs"] == "killed / Completed", killed
    blocked = row("native-file", "20")
    assert (blocked["model_calls"], blocked["outputs"], blocked["emails"]) == (1, 0, 0), blocked
    assert blocked["runs"] == "killed / blocked, stopped after 20 s", blocked


def test_the_throughput_bench_completes_every_subject_in_one_process_and_prefect_native(
        run_bench: RunBench, prefect_api: str) -> None:
    """A reduced run (100 subjects, 50 calls a second, 0.2 s answers): each contender's row
    says every call was accepted once and no subject failed (the figures are not asserted)."""
    out = run_bench("throughput.py", "--subjects", "100", "--rate", "50", "--latencies", "0.2",
                    "--contenders", "one", "native", env={"PREFECT_API_URL": prefect_api},
                    timeout=600)
    table = out[out.index("| contender |"):].splitlines()[2:]
    rows = {cells[0]: cells for cells in
            ([c.strip() for c in line.strip("|").split("|")] for line in table)}
    assert set(rows) == {"runledger, 1 process", "Prefect-native, rate_limit"}, out
    for cells in rows.values():
        assert (cells[4], cells[7]) == ("100", "0"), out  # accepted, failed


def test_the_throughput_bench_completes_every_subject_with_nothing_configured(
        run_bench: RunBench, prefect_api: str) -> None:
    """A reduced run (60 subjects, 20 calls a second, 0.2 s answers, 16 at once) of the two
    nothing-configured contenders, the server announcing its limits and announcing none: each
    row says every call was accepted once and no subject failed (the figures are not
    asserted)."""
    out = run_bench("throughput.py", "--subjects", "60", "--rate", "20", "--latencies", "0.2",
                    "--at-once", "16", "--contenders", "learned", "silent",
                    env={"PREFECT_API_URL": prefect_api}, timeout=600)
    table = out[out.index("| contender |"):].splitlines()[2:]
    rows = {cells[0]: cells for cells in
            ([c.strip() for c in line.strip("|").split("|")] for line in table)}
    assert set(rows) == {"runledger, nothing configured, 16 at once, announced",
                         "runledger, nothing configured, 16 at once, silent"}, out
    for cells in rows.values():
        assert (cells[4], cells[7]) == ("60", "0"), out  # accepted, failed


@pytest.mark.parametrize(("script", "args", "message"), [
    ("pipeline_bench.py", ["--sizes", "0"], "--sizes and --repeat must be positive"),
    ("outbox_claim_bench.py", ["--small", "30", "--claims", "3"],
     "--small must be at least (--claims + 2 warm-up claims) x --limit = 100"),
    ("outbox_claim_bench.py", ["--small", "500", "--backlog", "400"],
     "--backlog at least --small"),
])
def test_a_bench_refuses_sizes_it_cannot_measure_before_touching_a_database(
        script: str, args: list[str], message: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(BENCH / script), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
    assert done.stdout == ""  # refused before printing a header or opening a ledger


def _pipeline_bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(BENCH))  # the script imports its sibling databases.py
    spec = importlib.util.spec_from_file_location("pipeline_bench", BENCH / "pipeline_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("ratios", "expected"), [
    ([1.05, 1.08, 1.10, 1.12, 1.09], "target met"),
    ([1.20, 1.25, 1.30, 1.22, 1.18], "target missed"),
    ([0.95, 1.40, 1.05, 1.30, 1.12, 1.25], "undecided"),
])
def test_the_pipeline_verdict_needs_the_whole_interval_on_one_side_of_the_target(
        ratios: list[float], expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _pipeline_bench(monkeypatch)
    low, high = bench.median_interval(ratios)
    assert min(ratios) <= low <= bench.statistics.median(ratios) <= high <= max(ratios)
    assert bench.verdict(low, high) == expected
    assert bench.median_interval(ratios) == (low, high)  # the same rounds, the same interval


@pytest.mark.parametrize(("ratios", "expected"), [
    ([12.0, 14.0, 11.0, 13.0, 15.0], "target met"),
    ([4.0, 5.0, 6.0, 5.5, 4.5], "target missed"),
    ([6.0, 14.0, 9.0, 12.0, 8.0, 13.0], "undecided"),
])
def test_a_speed_up_target_is_met_only_when_the_whole_interval_is_at_or_above_it(
        ratios: list[float], expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An at-least target (the rerun's 10x) reads the interval from the other side."""
    bench = _pipeline_bench(monkeypatch)
    low, high = bench.median_interval(ratios)
    assert bench.verdict(low, high, bench.RERUN_TARGET, at_most=False) == expected
