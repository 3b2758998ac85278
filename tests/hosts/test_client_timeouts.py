"""The ledger's PostgreSQL connections give up on a server that stopped answering: two hosts
(``db`` with a private PostgreSQL, ``ctl`` running the ledger API in this process) and the link
between them cut silently, as a pulled cable or a dead host would. Before the client timeouts
(store.database.Reach), a lease renewal sent over such a link was still blocked after 60 s."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from flows.model import EndpointLimiter
from store import Intent, Ledger, LedgerUnavailable, Limits, RunIdentity
from store.errors import RunledgerError
from tests.hosts import netns
from tests.hosts.cluster import sweep_folders, unavailable
from tests.support.private_postgres import PrivateCluster, binaries

LEASE = 30.0
# The defaults (store.database.Reach): keepalive after 5 s idle, 3 probes 2 s apart; 10 s for
# unacknowledged data; 10 s to connect. Each case must fail well inside this.
NOTICE_WITHIN = 25.0


@dataclass
class TwoHosts:
    network: netns.Network
    url: str


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[TwoHosts]:
    """``db`` running PostgreSQL and ``ctl``, this thread inside ``ctl``."""
    reason = netns.why_unavailable()
    if reason:
        unavailable(reason)
    pg_bin = binaries()
    if pg_bin is None:
        unavailable("no PostgreSQL server binaries under /usr/lib/postgresql")
    assert pg_bin is not None
    netns.sweep()
    sweep_folders()
    home = Path(tempfile.mkdtemp(prefix=f"{netns.PREFIX}{os.getpid()}-"))
    home.chmod(0o755)  # the server runs as the postgres user below it
    network = netns.Network().create()
    server: PrivateCluster | None = None
    try:
        network.add_host("db", 2)
        network.add_host("ctl", 9)
        server = PrivateCluster(pg_bin, port=5432, home=home / "pg", listen="0.0.0.0",
                                hba=(f"host all all {netns.SUBNET}.0/24 trust",),
                                wrap=("ip", "netns", "exec", network.ns("db")))
        server.home.mkdir()
        server.start()
        url = f"postgresql+psycopg://postgres@{network.hosts['db']}:5432/postgres"
        with netns.entered(network.ns("ctl")):
            with Ledger.connect(url) as ledger:
                ledger.migrate()
            yield TwoHosts(network, url)
    finally:
        try:
            if server is not None:
                server.destroy()
        finally:
            network.destroy()
            shutil.rmtree(home, ignore_errors=True)


def outcome_within(work: object, seconds: float) -> tuple[float, BaseException | None, bool]:
    """Run ``work`` in a thread (it inherits this thread's namespace): the seconds it took, what
    it raised, and whether it had ended by ``seconds``."""
    assert callable(work)
    raised: list[BaseException] = []

    def call() -> None:
        try:
            work()
        except BaseException as exc:  # the outcome under test
            raised.append(exc)

    began = time.monotonic()
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    return time.monotonic() - began, (raised[0] if raised else None), not thread.is_alive()


def test_a_lease_renewal_over_a_cut_link_fails_within_the_client_timeouts(
        two_hosts: TwoHosts) -> None:
    """A worker holding a lease whose link to the database is cut hears of it by an error
    within about 25 s (tcp_user_timeout, keepalives), not after the kernel's 15 minutes; once
    healed, the same ledger object works again."""
    identity = RunIdentity("hosts-timeouts", "s1", datetime(2026, 1, 1, tzinfo=UTC), "1")
    with Ledger.connect(two_hosts.url) as ledger:
        claim = ledger.register_and_claim_many([(identity, None)], owner="ctl:1",
                                               lease=LEASE)[identity.run_id].claim
        assert claim is not None
        two_hosts.network.cut("ctl", "db")
        try:
            took, raised, ended = outcome_within(lambda: ledger.renew_many([claim], LEASE),
                                                 NOTICE_WITHIN + 35)
        finally:
            two_hosts.network.heal("ctl", "db")
        print(f"renewal over a cut link: {type(raised).__name__} after {took:.1f} s")
        assert ended and took < NOTICE_WITHIN, f"still blocked after {took:.0f} s"
        assert isinstance(raised, RunledgerError), raised
        assert ledger.renew_many([claim], LEASE)[identity.run_id] > ledger.now()


def test_a_new_connection_over_a_cut_link_fails_within_the_connect_timeout(
        two_hosts: TwoHosts) -> None:
    """Opening the ledger while the database host does not answer fails after the connect
    timeout (10 s) instead of waiting for the kernel's SYN retries."""
    two_hosts.network.cut("ctl", "db")
    try:
        def connect_and_read() -> None:
            with Ledger.connect(two_hosts.url) as ledger:
                ledger.now()

        took, raised, ended = outcome_within(connect_and_read, NOTICE_WITHIN + 35)
    finally:
        two_hosts.network.heal("ctl", "db")
    print(f"new connection over a cut link: {type(raised).__name__} after {took:.1f} s")
    assert ended and took < NOTICE_WITHIN, f"still connecting after {took:.0f} s"
    assert isinstance(raised, RunledgerError), raised


def test_calls_queued_for_an_endpoint_over_a_cut_link_fail_with_the_first_askings_error(
        two_hosts: TwoHosts) -> None:
    """Four subjects' model calls queued on one endpoint of a worker cut from the database: the
    first asking hears of the cut within the client timeouts and the three queued behind it
    fail with its error at once, instead of each waiting its own timeout in turn (40 s)."""
    subjects = [RunIdentity("hosts-limiter", f"s{n}", datetime(2026, 1, 1, tzinfo=UTC), "1")
                for n in range(4)]
    with Ledger.connect(two_hosts.url) as ledger:
        ledger.calls.configure_endpoint("hosts-ep", Limits(requests_per_minute=6_000))
        claimed = ledger.register_and_claim_many([(s, None) for s in subjects], owner="ctl:2",
                                                 lease=LEASE)
        limiter = EndpointLimiter(ledger.calls, "hosts-ep", in_flight_seconds=60.0,
                                  max_pause_seconds=60.0, bounds_in_flight=False)
        outcomes: list[BaseException | None] = []

        def every_call() -> None:
            def one(identity: RunIdentity) -> None:
                claim = claimed[identity.run_id].claim
                assert claim is not None
                try:
                    limiter.record(claim, Intent("hosts-ep", "m", 0, "d" * 64), 400)
                    outcomes.append(None)
                except BaseException as exc:  # the outcome under test
                    outcomes.append(exc)

            threads = [threading.Thread(target=one, args=(s,)) for s in subjects]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

        two_hosts.network.cut("ctl", "db")
        try:
            took, raised, ended = outcome_within(every_call, NOTICE_WITHIN + 35)
        finally:
            two_hosts.network.heal("ctl", "db")
        print(f"4 queued calls over a cut link: {[type(o).__name__ for o in outcomes]} "
              f"after {took:.1f} s")
        assert raised is None and ended and took < NOTICE_WITHIN, f"still asking after {took:.0f} s"
        assert all(isinstance(o, LedgerUnavailable) for o in outcomes), outcomes
        assert len(outcomes) == 4
        assert sum("this call did not ask" in str(o) for o in outcomes) == 3


pytestmark = [pytest.mark.drill, pytest.mark.postgres, pytest.mark.timeout(300)]
