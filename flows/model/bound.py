"""The most a model call can use before it leaves: its input tokens bounded from above, plus the
``max_tokens`` it asks for. A budget reserves this bound priced, and an endpoint's tokens per
minute take it, so that neither is passed whatever the number of calls in flight, as long as the
provider honours ``max_tokens``.

The input bound: for a model ``tiktoken`` knows (OpenAI's names), the tokens of its encoding;
for any other, the UTF-8 bytes of the texts, which a byte-level BPE tokenizer (GPT, Llama 3,
Qwen, Mistral's Tekken...) never exceeds, each token being at least one byte. Both add the chat
format's overhead: a few tokens per message (role and separators) and once per call (the reply's
priming, a template's own text). tiktoken downloads its encodings on first use: one that cannot
be loaded within ``LOAD_SECONDS`` (no network) leaves the byte bound for the rest of the process,
said once in the log."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import tiktoken

from flows.model.request import Message, Request
from flows.prices import PriceList

MESSAGE_OVERHEAD = 8  # tokens a chat format adds around each message (role, separators)
CALL_OVERHEAD = 64  # once per call: the reply's priming, a template's default system text
LOAD_SECONDS = 10.0  # how long the first call waits for an encoding to load, at most

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CallBound:
    """The most one call uses: ``input_tokens`` (its prompt and system text, bounded from above)
    and ``max_tokens`` (the most its answer may use)."""

    input_tokens: int
    max_tokens: int

    @property
    def tokens(self) -> int:
        """Input and output tokens together: what a tokens budget or bucket takes."""
        return self.input_tokens + self.max_tokens

    def cost_nanos(self, prices: PriceList, model: str) -> int | None:
        """The bound priced with ``model``'s prices; None when it has no price."""
        return prices.cost_nanos(model, self.input_tokens, self.max_tokens)

    def overrun(self, prompt_tokens: int | None, completion_tokens: int | None) -> int:
        """The tokens a provider billed beyond this bound (input and output each against its
        own): 0 when it honoured it, or reported no usage."""
        return (max(0, (prompt_tokens or 0) - self.input_tokens)
                + max(0, (completion_tokens or 0) - self.max_tokens))


def byte_bound(texts: list[str]) -> int:
    """The input bound without a tokenizer: the texts' UTF-8 bytes plus the chat overhead."""
    return sum(len(t.encode("utf-8")) for t in texts) + _overhead(texts)


def _overhead(texts: list[str]) -> int:
    return CALL_OVERHEAD + MESSAGE_OVERHEAD * len(texts)


Loader = Callable[[str], tiktoken.Encoding]


class InputBound:
    """Bounds a call's input tokens; the encodings it loaded (or failed to) are kept for the
    process. ``load`` loads an encoding by name (tiktoken's, which may download it)."""

    def __init__(self, load: Loader = tiktoken.get_encoding,
                 load_seconds: float = LOAD_SECONDS) -> None:
        self._load = load
        self.load_seconds = load_seconds
        self._encodings: dict[str, tiktoken.Encoding | None] = {}
        self._lock = threading.Lock()

    def tokens(self, model: str, prompt: str, system: str | None) -> int:
        """The most tokens ``model`` can count for this prompt and system text."""
        return self.of_texts(model, [system, prompt] if system else [prompt])

    def of_texts(self, model: str, texts: list[str]) -> int:
        """The most tokens ``model`` can count for these texts, each a message."""
        encoding = self.encoding(model)
        if encoding is None:
            return byte_bound(texts)
        # Text that looks like a special token is counted as the text it is, as providers do.
        return sum(len(encoding.encode(t, disallowed_special=())) for t in texts) \
            + _overhead(texts)

    def encoding(self, model: str) -> tiktoken.Encoding | None:
        """``model``'s tiktoken encoding; None when tiktoken does not know the model, or its
        encoding could not be loaded (said once)."""
        try:
            name = tiktoken.encoding_name_for_model(model)
        except KeyError:
            return None
        with self._lock:  # the first call loads it, the others wait for it (bounded)
            if name not in self._encodings:
                self._encodings[name] = self._load_bounded(name, model)
            return self._encodings[name]

    def _load_bounded(self, name: str, model: str) -> tiktoken.Encoding | None:
        found: list[tiktoken.Encoding] = []
        failed: list[BaseException] = []

        def load() -> None:
            try:
                found.append(self._load(name))
            except Exception as exc:  # no network, a broken cache: the byte bound holds anyway
                failed.append(exc)

        # A daemon thread: a download that hangs never holds a call or the process's exit.
        loader = threading.Thread(target=load, name=f"tiktoken-{name}", daemon=True)
        loader.start()
        loader.join(self.load_seconds)
        if found:
            return found[0]
        why = (f"{type(failed[0]).__name__}: {failed[0]}" if failed
               else f"not loaded within {self.load_seconds:g} s")
        log.warning("tiktoken encoding %s of model %s is unavailable (%s); its calls reserve "
                    "the byte bound (UTF-8 bytes of the prompt and system text) instead",
                    name, model, why[:300])
        return None


INPUT_BOUND = InputBound()  # the process's: each encoding is loaded once


def call_bound(model: str, prompt: str, system: str | None, max_tokens: int,
               inputs: InputBound = INPUT_BOUND) -> CallBound:
    """The bound of a plain call of ``model`` (a prompt after an optional system text) asking
    for at most ``max_tokens``."""
    messages = ((Message("system", system),) if system else ()) + (Message("user", prompt),)
    return request_bound(model, Request(messages), max_tokens, inputs)


def request_bound(model: str, request: Request, max_tokens: int,
                  inputs: InputBound = INPUT_BOUND) -> CallBound:
    """The bound of ``request`` to ``model``: its messages and output schema (which the
    provider adds to the prompt) bounded, plus the request's ``max_tokens`` or else the
    endpoint's ``max_tokens``."""
    texts = [m.content for m in request.messages]
    schema = request.schema()
    if schema is not None:
        texts.append(json.dumps(schema))
    return CallBound(inputs.of_texts(model, texts), request.parameters.max_tokens or max_tokens)
