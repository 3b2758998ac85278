"""A model call's bound: the byte bound never undercounts a byte-level BPE tokenizer's tokens;
a model tiktoken knows is counted with its encoding, and one whose encoding cannot be loaded
(no network, a download that hangs) falls back to the byte bound, said once; tokens billed
beyond the bound are its overrun; the offline model stops at max_tokens words."""

from __future__ import annotations

import logging
import threading

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.model import CallBound, InputBound, OfflineModel, call_bound
from flows.model.bound import CALL_OVERHEAD, MESSAGE_OVERHEAD, byte_bound
from flows.prices import ModelPrice, PriceList

GPT2_PATTERN = (r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"""
                r"""|\s+""")
MERGES = [b"th", b"the", b" t", b" the", b"in", b"ing", b"er", b"an", b"\xc3\xa9", b"  "]


def byte_level_bpe() -> tiktoken.Encoding:
    """A byte-level BPE encoding built in this process (no download): every byte, some merges."""
    ranks = {bytes([i]): i for i in range(256)}
    for merged in MERGES:
        ranks[merged] = len(ranks)
    return tiktoken.Encoding(name="test_bpe", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": len(ranks)})


ENCODING = byte_level_bpe()


@settings(max_examples=300, deadline=None)
@given(prompt=st.text(), system=st.none() | st.text())
def test_the_byte_bound_never_undercounts_a_byte_level_tokenizer(prompt: str,
                                                                 system: str | None) -> None:
    """Any unicode text: the tokenizer's tokens plus the chat overhead <= the byte bound."""
    texts = [system, prompt] if system else [prompt]
    counted = sum(len(ENCODING.encode(t, disallowed_special=())) for t in texts)
    bound = InputBound(load=lambda name: pytest.fail("no encoding for an unknown model"))
    assert counted + CALL_OVERHEAD + MESSAGE_OVERHEAD * len(texts) \
        <= bound.tokens("llama3.2", prompt, system) == byte_bound(texts)


def test_a_model_tiktoken_knows_is_counted_with_its_encoding() -> None:
    """gpt-4o-mini: its encoding's tokens plus the overhead, fewer than its bytes; loaded once;
    text that looks like a special token is counted as text."""
    loads: list[str] = []

    def load(name: str) -> tiktoken.Encoding:
        loads.append(name)
        return ENCODING

    inputs = InputBound(load=load)
    prompt = "the thing in the theatre, then <|endoftext|> again " * 20
    expected = len(ENCODING.encode(prompt, disallowed_special=())) + len(
        ENCODING.encode("Summarize.")) + CALL_OVERHEAD + 2 * MESSAGE_OVERHEAD
    assert inputs.tokens("gpt-4o-mini", prompt, "Summarize.") == expected
    assert expected < byte_bound([prompt, "Summarize."])
    assert inputs.tokens("gpt-4o-mini", "x", None) == 1 + CALL_OVERHEAD + MESSAGE_OVERHEAD
    assert loads == ["o200k_base"]


def test_an_encoding_that_cannot_load_falls_back_to_the_byte_bound_once_with_a_log_line(
        caplog: pytest.LogCaptureFixture) -> None:
    """No network: the loader fails; the byte bound is used, the failure logged once and the
    loader not asked again."""
    loads: list[str] = []

    def offline(name: str) -> tiktoken.Encoding:
        loads.append(name)
        raise ConnectionError("Name resolution failed for openaipublic.blob.core.windows.net")

    inputs = InputBound(load=offline)
    with caplog.at_level(logging.WARNING, logger="flows.model.bound"):
        first = inputs.tokens("gpt-4o-mini", "hello there", None)
        again = inputs.tokens("gpt-4o", "hello there", "Be brief.")
    assert first == byte_bound(["hello there"]) and again == byte_bound(["Be brief.", "hello there"])
    assert loads == ["o200k_base"]
    [line] = [r.getMessage() for r in caplog.records]
    assert "o200k_base" in line and "ConnectionError" in line and "byte bound" in line


def test_an_encoding_whose_download_hangs_is_given_up_after_the_load_bound() -> None:
    """A loader that never returns: the call waits the load bound, then reserves the bytes."""
    release = threading.Event()

    def hanging(name: str) -> tiktoken.Encoding:
        release.wait(30)
        return ENCODING

    inputs = InputBound(load=hanging, load_seconds=0.05)
    try:
        assert inputs.tokens("gpt-4o-mini", "hello", None) == byte_bound(["hello"])
        assert inputs.encoding("gpt-4o-mini") is None
    finally:
        release.set()


def test_a_call_bound_adds_max_tokens_prices_both_and_measures_an_overrun() -> None:
    """Input bound + max_tokens; priced input and output apart; billed beyond each is overrun."""
    bound = call_bound("llama3.2", "héllo", None, 100, InputBound())
    assert bound == CallBound(6 + CALL_OVERHEAD + MESSAGE_OVERHEAD, 100)
    assert bound.tokens == bound.input_tokens + 100
    prices = PriceList(currency="USD", prices={"m": ModelPrice(input=1, output=2)})
    assert bound.cost_nanos(prices, "m") == (bound.input_tokens * 1 + 100 * 2) * 1000
    assert bound.cost_nanos(prices, "unpriced") is None
    assert bound.overrun(bound.input_tokens, 100) == 0 == bound.overrun(None, None)
    assert bound.overrun(bound.input_tokens + 3, 150) == 53


def test_the_offline_model_stops_at_max_tokens_words() -> None:
    """Its usage is words: an answer of at most max_tokens of them."""
    text = "Globex announced a new plan for every analytics customer today. " * 3
    answer = OfflineModel(max_tokens=4, max_sentences=3).generate(text)
    assert answer.completion_tokens == 4 and answer.text == "Globex announced a new"
