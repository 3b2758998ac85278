"""Shared by the fuzz tests: the one contract every edge keeps (the input works, or an
InvalidInput with a message; never another exception) and the strategies of hostile input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import settings
from hypothesis import strategies as st

from store import InvalidInput

T = TypeVar("T")
FUZZ = settings(max_examples=200, deadline=None)

# Every code point, lone surrogates and controls included (st.text() leaves surrogates out).
any_char = st.characters(codec=None, exclude_categories=())
hostile_text = st.text(any_char, max_size=40) | st.sampled_from([
    "", " ", "\0", "\r\n", "\n", "\u2028", "\x85", "\ud800", "a\udfffb", "=?utf-8?q?x?=", "|",
    "💥", "é", "x" * 2000, "  padded  ",
])
json_leaf = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
             | hostile_text | st.binary(max_size=8) | st.just(object())
             | st.sets(st.integers(), max_size=2) | st.tuples(st.integers()))
json_like = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(hostile_text | st.integers() | st.none(), inner, max_size=4),
    max_leaves=20,
)


def works_or_refused(call: Callable[[], T]) -> T | InvalidInput:
    """``call()``'s value, or the InvalidInput it raised (with a message); any other exception
    propagates and fails the test."""
    try:
        return call()
    except InvalidInput as exc:
        assert str(exc).strip(), f"{type(exc).__name__} without a message"
        return exc


def refused(value: Any) -> bool:
    return isinstance(value, InvalidInput)
