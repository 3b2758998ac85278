"""The SMTP sink: files a person can open, Message-ID dedupe counts, faults, and the
`runledger sink` command in its own process."""

from __future__ import annotations

import asyncio
import email
import json
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import aiosmtplib
import pytest

from flows.mail.letter import Letter
from flows.mail.sink import STATS_FILE, Fault, Sink
from flows.ports import free_port
from store import InvalidInput
from tests.support.delivery import RUNLEDGER, cli_env
from tests.support.waiting import wait_until


def letter(key: str, recipient: str = "ana@example.com") -> bytes:
    return Letter(key=key, sender="jobs@example.com", recipient=recipient, subject=f"Digest {key}",
                  body="Hello\n", date=datetime(2026, 1, 5, tzinfo=UTC)).to_bytes()


async def send_all(port: int, keys: list[str]) -> list[str]:
    """Send one message per key over one connection; the outcome of each as text."""
    smtp = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, start_tls=False, timeout=10)
    await smtp.connect()
    results = []
    for key in keys:
        try:
            if not smtp.is_connected:
                await smtp.connect()
            await smtp.sendmail("jobs@example.com", ["ana@example.com"], letter(key))
            results.append("ok")
        except aiosmtplib.SMTPException as exc:
            results.append(type(exc).__name__)
    smtp.close()
    return results


def test_the_sink_writes_every_message_as_an_eml_file(tmp_path: Path) -> None:
    """Each accepted message is a .eml file that parses back to what was sent."""
    with Sink(maildir=tmp_path) as sink:
        assert asyncio.run(send_all(sink.port, ["a", "b"])) == ["ok", "ok"]
    files = sorted(tmp_path.glob("*.eml"))
    assert [f.name for f in files] == ["000001-a_runledger.eml", "000002-b_runledger.eml"]
    parsed = email.message_from_bytes(files[0].read_bytes())
    assert parsed["Message-ID"] == "<a@runledger>" and parsed["Subject"] == "Digest a"


def test_dedupe_counts_every_copy_but_stores_one(tmp_path: Path) -> None:
    """received counts copies, unique counts Message-IDs; with dedupe one file per Message-ID."""
    with Sink(maildir=tmp_path, dedupe=True) as sink:
        asyncio.run(send_all(sink.port, ["a", "b", "a", "a"]))
        assert sink.stats["received"] == 4 and sink.stats["unique"] == 2
        assert sink.stats["duplicates"] == 2
    assert len(list(tmp_path.glob("*.eml"))) == 2


def test_faults_answer_once_then_the_sink_accepts_again() -> None:
    """rcpt:451 and data:550 refuse one message each, data:drop keeps it and hangs up."""
    faults = [Fault.parse("rcpt:451"), Fault.parse("data:550"), Fault.parse("data:drop")]
    with Sink(faults=faults) as sink:
        results = asyncio.run(send_all(sink.port, ["a", "b", "c", "d"]))
        assert results == ["SMTPRecipientsRefused", "SMTPDataError", "SMTPServerDisconnected", "ok"]
        assert sink.stats["received"] == 2 and sink.stats["rejected"] == 2
        assert [m.message_id for m in sink.messages] == ["<c@runledger>", "<d@runledger>"]


def test_a_fault_can_target_one_recipient() -> None:
    """A fault with @RECIPIENT leaves other recipients alone."""
    with Sink(faults=[Fault.parse("rcpt:550:always@bob@example.com")]) as sink:
        assert asyncio.run(send_all(sink.port, ["a"])) == ["ok"]
        assert Fault.parse("rcpt:550:always@bob@example.com").recipient == "bob@example.com"


def test_the_trace_names_what_ended_each_try() -> None:
    """One trace entry per try, in order: the fault's label, or 250 for a clean acceptance."""
    faults = [Fault.parse("rcpt:451"), Fault.parse("data:drop"), Fault.parse("data:slow=0.01")]
    with Sink(faults=faults) as sink:
        asyncio.run(send_all(sink.port, ["a", "b", "c", "d"]))
        assert sink.trace == [("ana@example.com", "rcpt:451"), ("ana@example.com", "data:drop"),
                              ("ana@example.com", "data:slow=0.01"), ("ana@example.com", "250")]


def test_a_fault_with_a_chance_hits_a_seeded_random_share() -> None:
    """rcpt:451:always:0.5 refuses some messages and accepts others; the same seed refuses the
    same ones."""
    keys = [f"m{i}" for i in range(30)]
    outcomes = []
    for _ in range(2):
        with Sink(seed=24, faults=[Fault.parse("rcpt:451:always:0.5")]) as sink:
            outcomes.append(asyncio.run(send_all(sink.port, keys)))
    assert outcomes[0] == outcomes[1]
    assert set(outcomes[0]) == {"ok", "SMTPRecipientsRefused"}


@pytest.mark.parametrize("spec", ["rcpt", "mail:451", "rcpt:drop", "data:499", "data:451:0",
                                  "data:slow=x", "data:451:sometimes", "data:451:always:0",
                                  "data:451:always:1.5", "data:451:always:x",
                                  "data:451:1:0.5:9"])
def test_a_malformed_fault_is_refused(spec: str) -> None:
    """Fault specs are checked when parsed, with an error naming the problem."""
    with pytest.raises(InvalidInput, match="fault"):
        Fault.parse(spec)


@pytest.mark.processes
def test_runledger_sink_runs_in_its_own_process_until_sigterm(tmp_path: Path) -> None:
    """`runledger sink --host --port --maildir --dedupe` records messages, keeps stats.json
    current for other processes, and exits cleanly on SIGTERM."""
    port = free_port()
    maildir = tmp_path / "mail"
    env = cli_env("sqlite:///unused.db", Sink(port=port))
    process = subprocess.Popen(
        [*RUNLEDGER, "sink", "--host", "127.0.0.1", "--port", str(port), "--maildir", str(maildir),
         "--dedupe", "--fault", "rcpt:451"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (maildir / STATS_FILE).exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert asyncio.run(send_all(port, ["a", "a", "b"])) == ["SMTPRecipientsRefused", "ok", "ok"]

        def counted() -> tuple[int, int, int] | None:
            stats = json.loads((maildir / STATS_FILE).read_text())
            found = (stats["received"], stats["unique"], stats["rejected"])
            return found if sum(found) >= 5 else None

        assert wait_until(counted, 30, "stats.json to count the three sends") == (2, 2, 1)
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "sink listening on 127.0.0.1" in out
    assert len(list(maildir.glob("*.eml"))) == 2
