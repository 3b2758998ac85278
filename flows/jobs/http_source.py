"""Documents fetched over HTTP for a job's collect stage, with failures classified the way the
pipeline retries them: timeouts, lost connections, 429 and 5xx are transient (Retry-After is
kept); any other refusal, a non-text body or a body above the size limit is permanent."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

import httpx

from flows.errors import PermanentError, TransientError
from flows.retry_after import retry_after_seconds

USER_AGENT = "runledger-collect/1"
_SKIPPED_TAGS = {"script", "style", "noscript", "template", "head"}


_BLOCK_TAGS = {"address", "article", "aside", "blockquote", "br", "dd", "div", "dl", "dt",
               "figcaption", "footer", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "li",
               "main", "nav", "ol", "p", "pre", "section", "table", "td", "th", "tr", "ul"}


class _VisibleText(HTMLParser):
    """The text a reader sees in an HTML page: no markup, scripts or styles; one line per block."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[list[str]] = [[]]
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIPPED_TAGS:
            self._skipping += 1
        elif tag in _BLOCK_TAGS:
            self.lines.append([])

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED_TAGS and self._skipping:
            self._skipping -= 1
        elif tag in _BLOCK_TAGS:
            self.lines.append([])

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.lines[-1].append(data)

    def text(self) -> str:
        joined = (" ".join("".join(parts).split()) for parts in self.lines)
        return "\n".join(line for line in joined if line)


def visible_text(html: str) -> str:
    parser = _VisibleText()
    parser.feed(html)
    parser.close()
    return parser.text()


def fetch_document(client: httpx.Client, url: str, max_bytes: int) -> dict[str, Any]:
    """One document ``{"name": url, "text": ...}``; an HTML page is reduced to its visible text."""
    try:
        with client.stream("GET", url, headers={"User-Agent": USER_AGENT}) as response:
            _check_status(response, url)
            kind = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
            if not kind.startswith("text/"):
                raise PermanentError(f"{url} is {kind or 'of no content type'}, not a text document")
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise PermanentError(
                        f"{url} is larger than the {max_bytes}-byte limit for collected documents")
            text = body.decode(response.encoding or "utf-8", errors="replace")
    except httpx.TimeoutException as exc:
        raise TransientError(f"fetching {url} timed out ({type(exc).__name__})") from exc
    except httpx.TransportError as exc:
        raise TransientError(f"fetching {url} failed: {type(exc).__name__}: {exc}") from exc
    return {"name": url, "text": visible_text(text) if kind == "text/html" else text}


def _check_status(response: httpx.Response, url: str) -> None:
    status = response.status_code
    if status == 429 or status >= 500:
        raise TransientError(f"{url} answered {status}",
                             retry_after=retry_after_seconds(response.headers.get("Retry-After")))
    if not 200 <= status < 300:
        raise PermanentError(f"{url} answered {status}")


def http_client(timeout_seconds: float) -> httpx.Client:
    """A client for one collect call: redirects followed, the timeout on every phase."""
    return httpx.Client(follow_redirects=True, timeout=httpx.Timeout(timeout_seconds))
