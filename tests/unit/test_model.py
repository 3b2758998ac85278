"""Models without the network: the offline summarizer, Retry-After parsing, model settings."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Literal

import pytest
from pydantic import BaseModel, SecretStr

from flows.model import ModelMisconfigured, OfflineModel, model_from_settings
from flows.model.offline import sentences, summarize
from flows.model.openai_compatible import OpenAICompatibleModel
from flows.retry_after import retry_after_seconds
from flows.settings import RunledgerSettings

TEXT = """# Globex pricing

Globex announced a usage-based price plan for its analytics suite.
The analytics plan charges per thousand queries.
Unrelated: the weather was nice.

- Globex analytics customers keep their plan until renewal.
"""


def test_sentences_drop_markdown_markers() -> None:
    """Headings and list markers are not part of a sentence."""
    assert sentences("# Title\n\n- One. Two!\n") == ["Title", "One.", "Two!"]


def test_the_offline_summary_keeps_the_most_representative_sentences_in_order() -> None:
    """Sentences sharing the text's frequent words win; reading order is kept."""
    summary = summarize(TEXT, 2)
    assert "weather" not in summary
    assert summary.index("announced") < summary.index("renewal")


def test_the_offline_model_is_deterministic() -> None:
    """The same prompt always gives the same text, under the offline model's name."""
    model = OfflineModel()
    assert model.generate(TEXT) == model.generate(TEXT)
    assert model.generate(TEXT).model == "offline-extractive-v1"


def test_the_offline_model_answers_empty_text_with_empty_text() -> None:
    """Nothing to summarize gives an empty answer (validation rejects it later)."""
    assert OfflineModel().generate("   ").text == ""


@pytest.mark.parametrize(("header", "seconds"), [
    ("7", 7.0), ("0.5", 0.5), ("-3", 0.0), ("Mon, 05 Jan 2026 09:00:30 GMT", 30.0),
    ("soon", None), (None, None),
])
def test_retry_after_is_read_as_seconds_or_an_http_date(header: str | None,
                                                        seconds: float | None) -> None:
    """Both Retry-After forms of RFC 9110 are understood; garbage is ignored."""
    now = datetime(2026, 1, 5, 9, tzinfo=UTC)
    assert retry_after_seconds(header, now) == seconds


def test_the_offline_model_is_the_default() -> None:
    """Without RUNLEDGER_MODEL the offline model is used, with its configured delay."""
    model = model_from_settings(RunledgerSettings(offline_model_delay_seconds=0.25))
    assert isinstance(model, OfflineModel)
    assert model.delay_seconds == 0.25


def test_the_openai_model_needs_a_base_url_and_a_name() -> None:
    """An incomplete configuration is a clear error naming the missing settings."""
    with pytest.raises(ModelMisconfigured, match="RUNLEDGER_MODEL_BASE_URL"):
        model_from_settings(RunledgerSettings(model="openai", model_name="m"))


def test_the_api_key_never_shows_in_settings_or_the_model() -> None:
    """The key is a secret: neither the settings nor the client print it."""
    settings = RunledgerSettings(model="openai", model_base_url="http://127.0.0.1:9/v1",
                                 model_name="m", model_api_key=SecretStr("sk-very-secret"))
    model = model_from_settings(settings)
    assert isinstance(model, OpenAICompatibleModel)
    assert "sk-very-secret" not in repr(settings) + str(settings) + repr(model)
    model.close()


class Kind(enum.Enum):
    LAUNCH = "launch"
    PRICE = "price"


class Item(BaseModel):
    name: str
    what: str


class Everything(BaseModel):
    summary: str
    items: list[Item]
    kind: Kind
    tone: Literal["neutral", "alarmed"]
    score: float
    count: int
    urgent: bool
    note: str | None = None
    extra: dict[str, int]


def test_the_offline_model_answers_a_valid_instance_of_any_output_model() -> None:
    """Text fields get the summary (nested ones its sentences in turn), lists one element,
    numbers 0, enums and literals their first value, optional fields None."""
    answer = OfflineModel(max_sentences=2).generate("Acme launched Rocket. Acme cut prices.",
                                                    output=Everything)
    assert answer.parsed == Everything(
        summary="Acme launched Rocket. Acme cut prices.",
        items=[Item(name="Acme launched Rocket.", what="Acme cut prices.")],
        kind=Kind.LAUNCH, tone="neutral", score=0, count=0, urgent=False, note=None, extra={})
