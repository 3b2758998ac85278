"""Outbox delivery throughput against raw aiosmtplib, in one run, to the same SMTP sink running in
a separate process (`runledger sink`).

    uv run python bench/delivery_bench.py [--messages 2000] [--repeat 3]

Baseline: N prepared messages sent with aiosmtplib over one reused connection. Candidate: the
dispatcher's code path (`Dispatcher.run_pass`, what `runledger deliver` and the deliver-outbox flow
run) delivering N outbox rows end to end (claim, render, send, mark) on SQLite and on PostgreSQL.
Each round runs raw, SQLite, raw, PostgreSQL, so every ratio compares runs made seconds apart on
a shared, noisy machine; medians over the rounds are printed (target ratio >= 0.8). PostgreSQL is skipped when unreachable
(RUNLEDGER_BENCH_POSTGRES_URL, default postgresql+psycopg://postgres@127.0.0.1:5432/postgres)."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import aiosmtplib

from bench.databases import postgres_database
from flows.delivery.dispatcher import Dispatcher
from flows.delivery.policy import RetryPolicy
from flows.mail.letter import Letter
from flows.mail.settings import SmtpSettings, TlsMode
from flows.mail.sink import STATS_FILE
from flows.mail.smtp import SmtpTransport
from flows.ports import free_port
from store import Ledger, OutboxMessage, RunIdentity

SENDER = "jobs@example.com"
HOST = "127.0.0.1"
BODY = "Your weekly digest.\n\n" + "A line of the summary that the model wrote.\n" * 20


@contextmanager
def sink_process(maildir: Path) -> Iterator[int]:
    """`runledger sink` in its own process; yields its port."""
    port = free_port(HOST)
    process = subprocess.Popen(
        [sys.executable, "-c", "from flows.cli import main; main()", "sink", "--host", HOST,
         "--port", str(port), "--maildir", str(maildir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (maildir / STATS_FILE).exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the sink did not start: {process.stderr.read() if process.stderr else ''}")
            time.sleep(0.1)
        yield port
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def prepared(count: int) -> list[tuple[str, bytes]]:
    when = datetime.now(UTC)
    return [(f"bench{i}@example.com",
             Letter(key=uuid.uuid4().hex, sender=SENDER, recipient=f"bench{i}@example.com",
                    subject=f"Digest {i}", body=BODY, date=when).to_bytes())
            for i in range(count)]


async def raw_send(port: int, messages: list[tuple[str, bytes]]) -> float:
    """Seconds to send prepared messages over one aiosmtplib connection."""
    smtp = aiosmtplib.SMTP(hostname=HOST, port=port, start_tls=False, timeout=30,
                           local_hostname="localhost")
    started = time.perf_counter()
    await smtp.connect()
    for recipient, data in messages:
        await smtp.sendmail(SENDER, [recipient], data)
    await smtp.quit()
    return time.perf_counter() - started


def queue(ledger: Ledger, count: int) -> None:
    identity = RunIdentity("bench", uuid.uuid4().hex, datetime(2026, 1, 5, tzinfo=UTC), "v1")
    ledger.register(identity)
    claim = ledger.claim(identity.run_id, "bench", 600)
    assert claim is not None
    ledger.complete(claim, {"summary": "bench"}, [
        OutboxMessage(recipient=f"bench{i}@example.com", subject=f"Digest {i}", body=BODY)
        for i in range(count)
    ])


def dispatch(url: str, port: int, count: int, batch_size: int) -> float:
    """Seconds for one dispatcher pass to deliver ``count`` freshly queued outbox rows."""
    ledger = Ledger.connect(url)
    try:
        ledger.migrate()
        queue(ledger, count)
        settings = SmtpSettings(host=HOST, port=port, tls=TlsMode.NONE, mail_from=SENDER, timeout=30)
        dispatcher = Dispatcher(ledger, SmtpTransport(settings), RetryPolicy(), lease_seconds=600)
        started = time.perf_counter()
        report = asyncio.run(dispatcher.run_pass(batch_size=batch_size, max_seconds=600))
        seconds = time.perf_counter() - started
        if report.counts["sent"] != count:
            raise SystemExit(f"dispatcher sent {report.counts} instead of {count}")
        return seconds
    finally:
        ledger.close()


class Sink:
    """Checks after each run that the separate sink received exactly what was sent."""

    def __init__(self, maildir: Path) -> None:
        self.maildir = maildir
        self.expected = 0

    def check(self, sent: int) -> None:
        self.expected += sent
        time.sleep(0.5)  # the sink rewrites stats.json every 0.2 s
        got = int(json.loads((self.maildir / STATS_FILE).read_text())["received"])
        if got != self.expected:
            raise SystemExit(f"the sink received {got} messages, expected {self.expected}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds of raw, SQLite, raw, PostgreSQL (medians are reported)")
    parser.add_argument("--batch-size", type=int, default=100)
    args = parser.parse_args()
    n = args.messages
    raw_rates: list[float] = []
    rates: dict[str, list[float]] = {"sqlite": [], "postgresql": []}
    ratios: dict[str, list[float]] = {"sqlite": [], "postgresql": []}
    with tempfile.TemporaryDirectory() as tmp, postgres_database() as pg_url:
        maildir = Path(tmp) / "mail"
        urls = {"sqlite": f"sqlite:///{Path(tmp) / 'bench.db'}", "postgresql": pg_url}
        with sink_process(maildir) as port:
            sink = Sink(maildir)
            for round_ in range(1, args.repeat + 1):
                for dialect, url in urls.items():
                    if url is None:
                        continue
                    # Raw right before each dispatcher run: the machine is shared and its load
                    # drifts, so each ratio compares two runs made seconds apart.
                    letters = prepared(n)
                    cpu = time.process_time()
                    raw = n / asyncio.run(raw_send(port, letters))
                    raw_cpu = (time.process_time() - cpu) / n * 1000
                    sink.check(n)
                    cpu = time.process_time()
                    rate = n / dispatch(url, port, n, args.batch_size)
                    # includes queueing the rows (not timed): an upper bound on the pass's CPU
                    rate_cpu = (time.process_time() - cpu) / n * 1000
                    sink.check(n)
                    raw_rates.append(raw)
                    rates[dialect].append(rate)
                    ratios[dialect].append(rate / raw)
                    print(f"round {round_} {dialect:10}: raw {raw:5.0f} msg/s ({raw_cpu:.2f} ms CPU/msg), "
                          f"dispatcher {rate:5.0f} msg/s ({rate_cpu:.2f} ms CPU/msg incl. queueing), "
                          f"ratio {rate / raw:.2f}", flush=True)
    print(f"\nN = {n} messages per run, {args.repeat} rounds, sink in a separate process")
    print(f"raw aiosmtplib, one reused connection: median {statistics.median(raw_rates):5.0f} "
          f"msg/s, best {max(raw_rates):5.0f}")
    for dialect, values in rates.items():
        if values:
            ratio = statistics.median(ratios[dialect])
            verdict = "meets" if ratio >= 0.8 else "BELOW"
            print(f"dispatcher on {dialect:10} (claim, send, mark): median "
                  f"{statistics.median(values):5.0f} msg/s, best {max(values):5.0f}; median ratio "
                  f"{ratio:.2f} ({verdict} the 0.8 target), best/best {max(values) / max(raw_rates):.2f}")


if __name__ == "__main__":
    main()
