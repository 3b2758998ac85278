"""Structured output on the loopback model servers: a request's ``response_format`` JSON
schema (OpenAI's strict structured outputs) answered with a document that validates against
it, its text fields filled with the server's usual ``answer N``; and, by ``document``, the
input of a tool call a request forces (Anthropic's ``tool_choice``) of the tool's schema."""

from __future__ import annotations

import json
from typing import Any


def answer_text(body: dict[str, Any], text: str) -> str:
    """``text``, or, when the request asks for a JSON schema, a JSON document of that schema
    whose text fields are ``text``."""
    response_format = body.get("response_format") or {}
    if response_format.get("type") != "json_schema":
        return text
    return json.dumps(document(response_format["json_schema"]["schema"], text))


def document(schema: dict[str, Any], text: str) -> Any:
    """A document that validates against the JSON ``schema`` (the first choice of each union,
    enum or const; zeros and false), its text fields ``text``: an answer's structured output or
    a tool call's input."""
    return _value(schema, schema.get("$defs", {}), text)


def _value(schema: dict[str, Any], defs: dict[str, Any], text: str) -> Any:
    if "$ref" in schema:
        return _value(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, text)
    for union in ("anyOf", "oneOf", "allOf"):
        if union in schema:
            return _value(schema[union][0], defs, text)
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = kind[0]
    if kind == "object":
        return {name: _value(sub, defs, text)
                for name, sub in schema.get("properties", {}).items()}
    if kind == "array":
        return [_value(schema.get("items", {}), defs, text)]
    if kind in ("integer", "number"):
        return 0
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return text
