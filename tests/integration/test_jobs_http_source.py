"""competitor-summary's pages listed in urls.txt, fetched from a real HTTP server on loopback:
text and HTML documents, and failures classified as the pipeline retries them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.loopback import Answer, LoopbackServer, Request
from flows.errors import is_transient
from flows.jobs import PermanentError, TransientError
from flows.jobs import competitor_summary as summary
from store import InvalidInput

PERIOD = summary.job.parse_period("2026-01-05")


@dataclass
class Page:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


class Site(LoopbackServer):
    """A loopback HTTP server answering each path with its Page (404 for unknown paths)."""

    def __init__(self) -> None:
        super().__init__()
        self.pages: dict[str, Page] = {}
        self.hits: list[str] = []

    def url(self, path: str) -> str:
        return f"{self.origin}{path}"

    def answer(self, request: Request) -> Answer:
        self.hits.append(request.path)
        page = self.pages.get(request.path, Page(404, b"not found"))
        return Answer(page.status, page.body, {"Content-Type": page.content_type, **page.headers},
                      page.delay)


@pytest.fixture
def site() -> Iterator[Site]:
    with Site() as running:
        yield running


@pytest.fixture
def source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from tests.support.pipeline import copy_sample_data

    folder = copy_sample_data(tmp_path / "source")
    monkeypatch.setenv("RUNLEDGER_COMPETITOR_SUMMARY_SOURCE", str(folder))
    monkeypatch.setenv("RUNLEDGER_COMPETITOR_SUMMARY_FETCH_TIMEOUT_SECONDS", "0.5")
    return folder


def list_urls(source: Path, *urls: str) -> None:
    (source / "acme" / "urls.txt").write_text("# pages\n" + "\n".join(urls) + "\n", encoding="utf-8")


def test_listed_pages_follow_the_files_and_html_is_reduced_to_its_text(
        source: Path, site: Site) -> None:
    site.pages["/pricing.txt"] = Page(body=b"Acme Cloud now costs 12 EUR.")
    site.pages["/blog"] = Page(
        body=b"<html><head><title>t</title><style>p{}</style></head><body><h1>Launch</h1>"
             b"<script>track()</script><p>Acme ships &amp; sells <b>robots</b>.</p></body></html>",
        content_type="text/html; charset=utf-8")
    list_urls(source, site.url("/pricing.txt"), site.url("/blog"))
    raw = summary.collect("acme", PERIOD)
    names = [d["name"] for d in raw["documents"]]
    files = sorted(p.name for p in (source / "acme").glob("*.md"))
    assert names == [*files, site.url("/pricing.txt"), site.url("/blog")]
    assert raw["documents"][-2]["text"] == "Acme Cloud now costs 12 EUR."
    assert raw["documents"][-1]["text"] == "Launch\nAcme ships & sells robots."


@pytest.mark.parametrize("page", [
    Page(503, b"busy"),
    Page(429, b"slow down", headers={"Retry-After": "7"}),
    Page(200, b"late", delay=2.0),
])
def test_an_unavailable_page_is_transient(source: Path, site: Site, page: Page) -> None:
    site.pages["/news"] = page
    list_urls(source, site.url("/news"))
    with pytest.raises(TransientError) as error:
        summary.collect("acme", PERIOD)
    assert is_transient(error.value) and site.url("/news") in str(error.value)
    if page.status == 429:
        assert error.value.retry_after == 7.0


def test_an_unreachable_site_is_transient(source: Path, site: Site) -> None:
    url = site.url("/news")
    site.stop()
    list_urls(source, url)
    with pytest.raises(TransientError, match="fetching"):
        summary.collect("acme", PERIOD)


@pytest.mark.parametrize(("page", "problem"), [
    (Page(404, b"gone"), "answered 404"),
    (Page(200, b"\x89PNG", content_type="image/png"), "image/png, not a text document"),
    (Page(200, b"x" * 300_000), "larger than"),
])
def test_a_refused_or_unusable_page_is_permanent(source: Path, site: Site, page: Page,
                                                 problem: str) -> None:
    site.pages["/news"] = page
    list_urls(source, site.url("/news"))
    with pytest.raises(PermanentError, match=problem) as error:
        summary.collect("acme", PERIOD)
    assert not is_transient(error.value)


def test_a_line_that_is_not_an_http_url_is_refused_before_anything_is_fetched(
        source: Path, site: Site) -> None:
    list_urls(source, site.url("/news"), "file:///etc/passwd")
    with pytest.raises(InvalidInput, match="not an http"):
        summary.collect("acme", PERIOD)
    assert site.hits == []


def test_pages_alone_are_enough_documents(source: Path, site: Site) -> None:
    for document in (source / "acme").glob("*.md"):
        document.unlink()
    site.pages["/only"] = Page(body=b"Acme raised prices.")
    list_urls(source, site.url("/only"))
    assert [d["text"] for d in summary.collect("acme", PERIOD)["documents"]] == [
        "Acme raised prices."]
