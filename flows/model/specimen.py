"""A specimen of a pydantic output model filled from one text: what the offline model answers
to a request for structured output, so that jobs asking for one run offline too. Rule per
field type: text fields get the text (inside a nested model, its sentences in turn, so that a
list of named things reads as one), numbers 0, booleans False, lists and sets one element,
dicts none, enums and literals their first value, nested models a specimen of their own,
an optional field None."""

from __future__ import annotations

import enum
import itertools
import re
import types
import typing
from typing import Any

from pydantic import BaseModel

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def specimen(output: type[BaseModel], text: str) -> dict[str, Any]:
    """The JSON document of an instance of ``output`` whose fields are filled from ``text``."""
    return _Filler(text).model(output, nested=False)


class _Filler:
    def __init__(self, text: str) -> None:
        self.text = text
        self.sentences = itertools.cycle(_SENTENCE_END.split(text.strip()) or [text])

    def model(self, output: type[BaseModel], *, nested: bool) -> dict[str, Any]:
        return {name: self.value(field.annotation, nested)
                for name, field in output.model_fields.items()}

    def value(self, annotation: Any, nested: bool) -> Any:
        found = _value(annotation, self, nested)
        if found is _TEXT:
            return next(self.sentences) if nested else self.text
        return found


_TEXT = object()  # a text field: the filler decides which text


def _value(annotation: Any, filler: _Filler, nested: bool) -> Any:
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if origin is typing.Annotated:
        return filler.value(arguments[0], nested)
    if origin in (typing.Union, types.UnionType):
        if type(None) in arguments:
            return None
        return filler.value(arguments[0], nested)
    if origin is typing.Literal:
        return arguments[0]
    if origin in (list, tuple, set, frozenset):
        return [filler.value(arguments[0], True)] if arguments else []
    if origin is dict or annotation is dict:
        return {}
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return filler.model(annotation, nested=True)
        if issubclass(annotation, enum.Enum):
            return next(iter(annotation)).value
        if issubclass(annotation, bool):
            return False
        if issubclass(annotation, int | float):
            return 0
    return _TEXT
