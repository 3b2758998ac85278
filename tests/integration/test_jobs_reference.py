"""The reference jobs' stage functions on real files (competitor-summary's source folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.jobs import Candidate, ValidationFailed
from flows.jobs import competitor_summary as summary
from flows.model import OfflineModel
from store import InvalidInput
from store.errors import InvalidMessage


@pytest.fixture
def source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the shipped sample data, selected through the job's settings."""
    from tests.support.pipeline import copy_sample_data

    folder = copy_sample_data(tmp_path / "source")
    monkeypatch.setenv("RUNLEDGER_COMPETITOR_SUMMARY_SOURCE", str(folder))
    return folder


PERIOD = summary.job.parse_period("2026-01-05")


def test_the_shipped_sample_data_has_two_workspaces() -> None:
    """Without settings the job runs on the sample data inside the package."""
    assert summary.workspaces() == ["acme", "globex"]


def test_collect_reads_the_workspaces_documents_in_name_order(source: Path) -> None:
    """The raw input lists each Markdown document with its text."""
    raw = summary.collect("acme", PERIOD)
    assert [d["name"] for d in raw["documents"]] == ["globex-pricing.md", "initech-launch.md"]
    assert raw["period"] == "2026-01-05"


def test_the_offline_summary_of_the_sample_data_passes_validation(source: Path) -> None:
    """transform + validate on the shipped documents gives a non-empty, bounded summary."""
    candidate = summary.transform(summary.collect("acme", PERIOD), OfflineModel())
    summary.validate(candidate)
    assert candidate.model == "offline-extractive-v1"
    assert candidate.output()["documents"] == ["globex-pricing.md", "initech-launch.md"]


def test_one_message_per_subscriber(source: Path) -> None:
    """Each subscriber gets one email with the summary and its sources."""
    output = {"text": "Summary.", "documents": ["a.md"], "model": "m"}
    messages = summary.messages("acme", PERIOD, output)
    assert [m.recipient for m in messages] == ["ceo@acme.example", "product-team@acme.example"]
    assert messages[0].subject == "Competitor summary for acme, 2026-01-05"
    assert "Sources: a.md" in messages[0].body


def test_an_invalid_subscriber_address_is_a_clear_error(source: Path) -> None:
    """A bad line in subscribers.txt names the file and the address."""
    (source / "acme" / "subscribers.txt").write_text("not-an-address\n")
    with pytest.raises(InvalidMessage, match="not-an-address"):
        summary.params("acme", PERIOD)


def test_a_workspace_outside_the_source_folder_is_refused(source: Path) -> None:
    """A subject cannot climb out of the source folder."""
    with pytest.raises(InvalidInput, match="has no folder"):
        summary.collect("../source", PERIOD)


def test_a_workspace_without_documents_is_a_clear_error(source: Path) -> None:
    """Nothing to summarize is refused at collect."""
    for document in (source / "globex").glob("*.md"):
        document.unlink()
    with pytest.raises(InvalidInput, match="no documents"):
        summary.collect("globex", PERIOD)


def test_validation_refuses_empty_and_oversized_summaries(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty or too long summary is a validation failure."""
    monkeypatch.setenv("RUNLEDGER_COMPETITOR_SUMMARY_MAX_SUMMARY_CHARS", "10")
    with pytest.raises(ValidationFailed, match="empty"):
        summary.validate(Candidate("  ", "m"))
    with pytest.raises(ValidationFailed, match="above the 10-character limit"):
        summary.validate(Candidate("x" * 11, "m"))
