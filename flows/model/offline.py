"""The offline model: an extractive summarizer that needs no network and no downloaded weights.

It keeps the few sentences whose words are most frequent in the text, in their original order.
Deterministic, so the same input always gives the same summary. It reports its usage in words
(whitespace-separated, the system text included in the prompt's), where a provider counts
tokens: a model without a price, whose usage still shows what it read and wrote. Asked for
structured output, it answers a specimen of the output model filled with the summary."""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter

from flows.model.asking import Unrecorded
from flows.model.protocol import Generation
from flows.model.request import Request
from flows.model.specimen import specimen

NAME = "offline-extractive-v1"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"[^\W\d_]{3,}", re.UNICODE)
_MARKUP = re.compile(r"^[ \t]*(?:#{1,6}[ \t]+|[-*+][ \t]+|\d+[.)][ \t]+|>[ \t]*)", re.MULTILINE)
STOP_WORDS = frozenset(
    ["the", "and", "for", "are", "but", "not", "you", "all", "any", "can", "had", "her", "was", "one", "our", "out", "has", "have", "this", "that", "with", "from", "they", "will", "would", "there", "their", "what", "about", "which", "when", "were", "been", "into", "more", "than", "then", "them", "these", "some", "its", "also", "very", "just", "over", "such", "only", "other", "could", "should", "after", "before", "while", "where", "who", "how", "our", "your", "his", "she", "him", "may", "might", "must", "each", "most", "both", "few", "those", "being"]
)


def sentences(text: str) -> list[str]:
    """The sentences of ``text``, with Markdown heading and list markers removed."""
    plain = _MARKUP.sub("", text)
    parts: list[str] = []
    for block in re.split(r"\n\s*\n", plain):
        flat = " ".join(block.split())
        parts.extend(s.strip() for s in _SENTENCE_END.split(flat) if s.strip())
    return parts


def summarize(text: str, max_sentences: int) -> str:
    """The ``max_sentences`` most representative sentences of ``text``, in reading order."""
    found = sentences(text)
    words = [w.lower() for w in _WORD.findall(text)]
    frequency = Counter(w for w in words if w not in STOP_WORDS)
    if not found or not frequency:
        return " ".join(found[:max_sentences])

    def score(index: int) -> float:
        tokens = [w.lower() for w in _WORD.findall(found[index])]
        useful = [frequency[w] for w in tokens if w in frequency]
        # Dividing by the square root favours informative sentences without rewarding length.
        return sum(useful) / math.sqrt(max(len(tokens), 1))

    best = sorted(range(len(found)), key=lambda i: (-score(i), i))[:max_sentences]
    return " ".join(found[i] for i in sorted(best))


def words(text: str | None) -> int:
    """The offline model's unit of usage: whitespace-separated words."""
    return len(text.split()) if text else 0


class OfflineModel(Unrecorded):
    """A model client that summarizes the user messages by extraction, in at most
    ``max_tokens`` words (the request's, else its own); ``delay_seconds`` simulates latency."""

    name = NAME
    endpoint = "offline"

    def __init__(self, *, max_sentences: int = 3, delay_seconds: float = 0.0,
                 max_tokens: int = 1024) -> None:
        self.max_sentences = max_sentences
        self.delay_seconds = delay_seconds
        self.max_tokens = max_tokens

    def complete(self, request: Request) -> Generation:
        if self.delay_seconds:
            time.sleep(self.delay_seconds)
        prompt = "\n\n".join(m.content for m in request.turns if m.role == "user")
        limit = request.parameters.max_tokens or self.max_tokens
        # At most max_tokens words, as a provider stops at max_tokens tokens.
        text = " ".join(summarize(prompt, self.max_sentences).split(" ")[:limit])
        if request.output is not None:
            text = json.dumps(specimen(request.output, text))
        read = sum(words(m.content) for m in request.messages if m.role != "assistant")
        return Generation(text, self.name, read, words(text))

    def close(self) -> None:
        return None
