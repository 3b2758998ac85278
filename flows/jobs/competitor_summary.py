"""competitor-summary: every day, per workspace, summarize the competitor documents collected
for it and email the summary to the workspace's subscribers; optionally also POST it to a
webhook (RUNLEDGER_COMPETITOR_SUMMARY_WEBHOOK, an endpoint block) and write it once to object
storage (RUNLEDGER_COMPETITOR_SUMMARY_BUCKET, an S3Bucket block).

A source folder holds one sub-folder per workspace (the subjects) with the documents
(``*.md``), optionally ``urls.txt`` (one http(s) URL per line: pages fetched at collect time,
HTML reduced to its text) and ``subscribers.txt`` (one address per line). The default source is
the sample data shipped in this package; point RUNLEDGER_COMPETITOR_SUMMARY_SOURCE at your own
folder. What collect gathered is stored once per Run: a retry summarizes the same documents."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from flows.jobs import (
    Approval,
    Candidate,
    InvalidInput,
    Job,
    Model,
    OutboxMessage,
    Period,
    Target,
    ValidationFailed,
    normalize_address,
)
from flows.jobs.http_source import fetch_document, http_client

SAMPLE_DATA = Path(__file__).with_name("sample_data")
SUBSCRIBERS = "subscribers.txt"
URLS = "urls.txt"
INSTRUCTIONS = (
    "You brief a product team on its competitors. Summarize the documents below in at most "
    "five sentences of plain, factual text, and list each product or plan a competitor "
    "launched, by name, with one factual sentence about it. Do not invent facts."
)


class Launch(BaseModel):
    """A product or plan a competitor launched."""

    name: str = Field(description="The product's or plan's name.")
    what: str = Field(description="One factual sentence about it.")


class Briefing(BaseModel):
    """What the model answers: the summary, and the launches it names."""

    summary: str = Field(description="At most five sentences of plain, factual text.")
    launches: list[Launch] = Field(description="Each launch the documents name.")


class CompetitorSummarySettings(BaseSettings):
    """Where the documents are, which timezone a day is counted in, and how long a summary may be."""

    model_config = SettingsConfigDict(env_prefix="RUNLEDGER_COMPETITOR_SUMMARY_", extra="ignore")

    source: Path = Field(
        default=SAMPLE_DATA,
        description="Folder with one sub-folder per workspace (``*.md``, ``urls.txt``, "
                    "``subscribers.txt``).")
    timezone: str = Field(default="Europe/Paris", description="IANA zone a day is counted in.")
    max_summary_chars: int = Field(default=2_000,
                                   description="A longer summary fails validation.")
    max_source_bytes: int = Field(default=200_000,
                                  description="Most bytes of documents collected per workspace.")
    fetch_timeout_seconds: float = Field(default=20.0,
                                         description="Timeout of each page fetched from urls.txt.")
    webhook: str | None = Field(
        default=None,
        description="Name of a runledger webhook endpoint block: each summary is also POSTed "
                    "there as JSON (e.g. a Slack incoming webhook or an internal API).")
    bucket: str | None = Field(
        default=None,
        description="Name of a prefect-aws S3Bucket block: each summary is also written there "
                    "once, as competitor-summary/<workspace>/<day>.md.")
    approval: bool = Field(
        default=False,
        description="Hold every summary until a person approves it (`runledger outbox approve`, "
                    "or the review-outbox flow run in the Prefect UI).")


def _settings() -> CompetitorSummarySettings:
    return CompetitorSummarySettings()


def _folder(workspace: str) -> Path:
    source = _settings().source
    folder = source / workspace
    if not folder.is_dir() or folder.parent != source:
        raise InvalidInput(f"workspace {workspace!r} has no folder in {source}")
    return folder


def workspaces() -> list[str]:
    """Every workspace of the source folder: each sub-folder with a subscribers file."""
    source = _settings().source
    if not source.is_dir():
        raise InvalidInput(f"competitor-summary source folder {source} does not exist")
    return sorted(p.name for p in source.iterdir() if (p / SUBSCRIBERS).is_file())


def subscribers(workspace: str) -> list[str]:
    """The workspace's subscribers, normalized and sorted; an invalid address is an error."""
    path = _folder(workspace) / SUBSCRIBERS
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    found = {normalize_address(line, f"subscriber in {path}") for line in lines
             if line and not line.startswith("#")}
    return sorted(found)


def urls(workspace: str) -> list[str]:
    """The pages listed in the workspace's urls.txt, in file order; only http(s) URLs."""
    path = _folder(workspace) / URLS
    if not path.is_file():
        return []
    found = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    listed = [url for url in found if url and not url.startswith("#")]
    for url in listed:
        if not url.startswith(("http://", "https://")) or any(c.isspace() for c in url):
            raise InvalidInput(f"{path}: {url!r} is not an http(s) URL")
    return listed


def collect(workspace: str, period: Period) -> dict[str, Any]:
    """The workspace's documents (name and text): its files in name order, then its pages."""
    settings = _settings()
    limit = settings.max_source_bytes
    paths = sorted(_folder(workspace).glob("*.md"))
    pages = urls(workspace)
    if not paths and not pages:
        raise InvalidInput(f"workspace {workspace!r} has no documents (*.md or {URLS}) to summarize")
    too_large = InvalidInput(
        f"workspace {workspace!r} has more than {limit} bytes of documents "
        "(RUNLEDGER_COMPETITOR_SUMMARY_MAX_SOURCE_BYTES)"
    )
    left = limit - sum(p.stat().st_size for p in paths)
    if left < 0:
        raise too_large
    documents = [{"name": p.name, "text": p.read_text(encoding="utf-8")} for p in paths]
    if pages:
        with http_client(settings.fetch_timeout_seconds) as client:
            for url in pages:
                if left <= 0:
                    raise too_large
                page = fetch_document(client, url, left)
                left -= len(page["text"].encode("utf-8"))
                documents.append(page)
    return {"workspace": workspace, "period": period.label, "documents": documents}


def transform(raw: dict[str, Any], model: Model) -> Candidate:
    """One call, answered as a ``Briefing`` (structured output): its summary is the text."""
    prompt = "\n\n".join(f"## {d['name']}\n\n{d['text'].strip()}" for d in raw["documents"])
    answer = model.generate(prompt, system=INSTRUCTIONS, output=Briefing)
    briefing = Briefing.model_validate(answer.parsed)
    return Candidate(briefing.summary, answer.model, {
        "workspace": raw["workspace"], "documents": [d["name"] for d in raw["documents"]],
        "launches": [launch.model_dump() for launch in briefing.launches],
    })


def validate(candidate: Candidate) -> None:
    limit = _settings().max_summary_chars
    if not candidate.text.strip():
        raise ValidationFailed("the model returned an empty summary")
    if len(candidate.text) > limit:
        raise ValidationFailed(
            f"the summary has {len(candidate.text)} characters, above the {limit}-character limit"
        )


def messages(workspace: str, period: Period, output: dict[str, Any]) -> list[OutboxMessage]:
    """An email per subscriber; with a webhook endpoint, a JSON POST; with a bucket, the
    summary as a Markdown report written once."""
    settings = _settings()
    subject = f"Competitor summary for {workspace}, {period.label}"
    # Summaries completed before launches were asked for have none.
    launches = output.get("launches") or []
    listed = "".join(f"- {launch['name']}: {launch['what']}\n" for launch in launches)
    body = (f"{output['text']}\n\n" + (f"Launches:\n{listed}\n" if listed else "")
            + f"Sources: {', '.join(output['documents'])}\n")
    made = [OutboxMessage(recipient, subject, body) for recipient in subscribers(workspace)]
    if settings.webhook:
        made.append(OutboxMessage.webhook(settings.webhook, {
            "job": "competitor-summary", "workspace": workspace, "period": period.label,
            "text": subject + "\n\n" + output["text"], "summary": output["text"],
            "launches": launches, "documents": output["documents"],
        }, subject=subject))
    if settings.bucket:
        report = f"# {subject}\n\n{body}"
        made.append(OutboxMessage.object(
            settings.bucket, f"competitor-summary/{workspace}/{period.label}.md", report,
            "text/markdown"))
    return made


def targets() -> list[Target]:
    """Email, and the webhook endpoint and bucket when they are set."""
    settings = _settings()
    return [Target.email(),
            *([Target.webhook(settings.webhook)] if settings.webhook else []),
            *([Target.object(settings.bucket)] if settings.bucket else [])]


def approval() -> Approval | None:
    """Every message waits for a person when RUNLEDGER_COMPETITOR_SUMMARY_APPROVAL is set."""
    return Approval() if _settings().approval else None


def params(workspace: str, period: Period) -> dict[str, Any]:
    """The recipients shape the Run: the same day with other recipients (or another webhook
    endpoint or bucket) is a conflict."""
    settings = _settings()
    found: dict[str, Any] = {"recipients": subscribers(workspace)}
    # Only when set, so that Runs from before these settings keep their fingerprint.
    if settings.webhook:
        found["webhook"] = settings.webhook
    if settings.bucket:
        found["bucket"] = settings.bucket
    return found


job = Job(
    name="competitor-summary",
    version="1",
    cadence="daily",
    timezone=_settings().timezone,
    subjects=workspaces,
    collect=collect,
    transform=transform,
    validate=validate,
    messages=messages,
    targets=targets,
    params=params,
    approval=approval,
    # A summary three days late helps nobody: after an outage only the latest day runs.
    missed_runs="latest",
    due=timedelta(hours=7),  # deployments/prefect.yaml: 07:00 in the job's timezone
    description="Daily competitor summary per workspace, emailed to its subscribers (and "
                "optionally POSTed to a webhook and written to object storage).",
)
