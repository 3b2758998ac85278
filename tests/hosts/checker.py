"""The checker, run after each scenario: it reads only the final state (the ledger through
``store.Ledger``, the Prefect server's flow runs) and what the receivers got (the sink's .eml
files, the workers' model call log, the model host's request log), and asserts:

- every owed Run completed, by exactly one Attempt (no duplicate completion);
- one outbox row per (Run, recipient), each ``sent`` (or ``uncertain``) and at the sink: once,
  or more often under the same Message-ID, each extra copy explained by a delivery attempt whose
  outcome was not a clean ``sent`` (uncertain, or lost with its process or link);
- model calls per Run within invariant 11: the Attempt that completed it made at most one, and
  every other call was made by an Attempt that did not complete it (an answer lost in flight),
  so calls <= Attempts of that Run;
- no Run left leased (``running``);
- every flow run of the server in a terminal state."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from email.parser import BytesHeaderParser
from pathlib import Path
from typing import Any

from prefect.client.schemas.objects import FlowRun

from store import Ledger
from tests.hosts.jobs import recipient, subjects
from tests.hosts.product import message_id_for


@dataclass
class Summary:
    scenario: str
    owed: int
    completed: int
    duplicate_completions: int
    attempts: dict[int, int]  # attempts per Run -> Runs
    model_calls: dict[int, int]  # calls per Run -> Runs
    outbox_rows: int
    statuses: dict[str, int]
    sink_received: int
    sink_unique: int
    resent: int
    leased: int
    flow_runs: dict[str, int]
    extra: dict[str, Any]

    def line(self) -> str:
        extra = "".join(f", {k} {v}" for k, v in self.extra.items())
        return (f"[{self.scenario}] Runs completed {self.completed} of {self.owed}, duplicate "
                f"completions {self.duplicate_completions}, attempts per Run {self.attempts}, "
                f"model calls per Run {self.model_calls}, outbox rows {self.outbox_rows} "
                f"{self.statuses}, sink {self.sink_received} received / {self.sink_unique} "
                f"unique Message-IDs ({self.resent} resent copies), Runs left leased "
                f"{self.leased}, flow runs {self.flow_runs}{extra}")


def sink_copies(maildir: Path) -> Counter[str]:
    """Message-ID -> copies the sink stored."""
    parser = BytesHeaderParser()
    copies: Counter[str] = Counter()
    for path in maildir.glob("*.eml"):
        found = parser.parsebytes(path.read_bytes()).get("Message-ID")
        if found:
            copies[found.strip()] += 1
    return copies


def check(scenario: str, ledger: Ledger, job: str, size: int, periods: list[str],
          maildir: Path, flow_runs: list[FlowRun],
          extra: dict[str, Any] | None = None) -> Summary:
    """Assert the scenario's end state (see the module's docstring); return its summary."""
    owed = size * len(periods)
    runs = ledger.runs(job=job, limit=owed + 10)
    assert len(runs) == owed, f"{len(runs)} Runs of {job}, owed {owed}"
    assert {r.subject for r in runs} == set(subjects(size))
    attempts = {r.run_id: ledger.attempts(r.run_id) for r in runs}
    completers: dict[str, str] = {}
    duplicates = 0
    for run in runs:
        done = [a for a in attempts[run.run_id] if a.outcome == "completed"]
        duplicates += max(0, len(done) - 1)
        if done:
            completers[run.run_id] = done[0].attempt_id
    completed = [r for r in runs if r.status == "completed"]
    leased = [r for r in runs if r.status == "running"]

    # Paid calls from the ledger's own record (refused ones are not billed): the completing
    # Attempt paid at most once, and every other paid call is one lost in flight.
    recorded = ledger.calls.of_runs([r.run_id for r in runs])
    calls: dict[str, list[str]] = {
        run_id: [c.attempt_id for c in found if c.outcome != "refused"]
        for run_id, found in recorded.items()}
    for run_id, paid in calls.items():
        mine = paid.count(completers.get(run_id, ""))
        lost = sum(1 for c in recorded[run_id] if c.outcome in (None, "lost"))  # never answered
        assert mine <= 1, (run_id, paid, "the completing Attempt called the model twice")
        assert len(paid) <= 1 + lost, (run_id, recorded[run_id], "a call paid twice, none lost")

    messages = [m for r in runs for m in ledger.outbox.messages(run_id=r.run_id, limit=10)]
    keys = Counter((m.run_id, m.recipient) for m in messages)
    copies = sink_copies(maildir)
    resent = 0
    for m in messages:
        n = copies[message_id_for(m.message_id)]
        assert n >= 1 or m.status not in ("sent",), (m.message_id, m.status, "sent, not at sink")
        assert m.status in ("sent", "uncertain") and n >= 1, (m.message_id, m.status, n)
        if n > 1:
            resent += n - 1
            unclean = [a for a in ledger.outbox.delivery_attempts(m.message_id) if a.outcome != "sent"]
            lost = m.attempts - len(ledger.outbox.delivery_attempts(m.message_id))
            assert n - 1 <= len(unclean) + lost, (m.message_id, n, unclean, lost)
    states = Counter(r.state.name if r.state and r.state.name else "none" for r in flow_runs)
    summary = Summary(
        scenario, owed, len(completed), duplicates,
        dict(sorted(Counter(len(a) for a in attempts.values()).items())),
        dict(sorted(Counter(len(calls.get(r.run_id, [])) for r in runs).items())),
        len(messages), dict(Counter(m.status for m in messages)),
        sum(copies[message_id_for(m.message_id)] for m in messages),
        len({message_id_for(m.message_id) for m in messages} & set(copies)), resent,
        len(leased), dict(states), extra or {})
    print(summary.line(), flush=True)
    assert len(completed) == owed and duplicates == 0, summary
    assert not leased, summary
    assert len(messages) == owed and set(keys.values()) == {1}, summary
    assert {m.recipient for m in messages} == {recipient(job, s) for s in subjects(size)}
    unfinished = [(r.id, r.state.name if r.state else None) for r in flow_runs
                  if r.state is None or not r.state.is_final()]
    assert not unfinished, unfinished
    return summary
