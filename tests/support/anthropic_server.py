"""An Anthropic-compatible Messages API on loopback (``POST /v1/messages``), for the tests of
the Anthropic client through the official SDK: its message JSON (text or tool_use content,
stop_reason, usage with cache reads and writes), its error shape
(``{"type": "error", "error": {"type": ..., "message": ...}}``) and its headers
(``anthropic-ratelimit-*``, ``retry-after``). Scripted replies are served first; afterwards
every call answers ``answer N`` (N counts the requests)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.anthropic_batch_provider import ERROR_TYPES
from bench.loopback import Answer, Request, ScriptedServer, json_answer

USAGE = {"input_tokens": 100, "output_tokens": 30}


@dataclass
class Reply:
    """One scripted answer: a status, the text (or a tool's input, ``tool``), the stop reason,
    the usage and headers the server sends."""

    status: int = 200
    text: str | None = None
    tool: dict[str, Any] | None = None
    stop_reason: str = "end_turn"
    usage: dict[str, int] = field(default_factory=lambda: dict(USAGE))
    headers: dict[str, str] = field(default_factory=dict)


class AnthropicServer(ScriptedServer[Reply]):
    """Anthropic's Messages API, scripted."""

    def __init__(self) -> None:
        super().__init__(Reply)

    @property
    def base_url(self) -> str:
        return self.origin

    def answer(self, request: Request) -> Answer:
        count, sent, reply = self.next_reply(request)
        if reply.status != 200:
            kind = ERROR_TYPES.get(reply.status, "api_error")
            return json_answer(reply.status, {"type": "error", "error": {
                "type": kind, "message": f"{kind} (status {reply.status})"}}, reply.headers)
        if reply.tool is not None:
            content: list[dict[str, Any]] = [{
                "type": "tool_use", "id": f"toolu_{count:04d}",
                "name": sent["tools"][0]["name"], "input": reply.tool}]
        else:
            content = [{"type": "text",
                        "text": f"answer {count}" if reply.text is None else reply.text}]
        return json_answer(200, {
            "id": f"msg_{count:04d}", "type": "message", "role": "assistant",
            "model": sent["model"], "content": content,
            "stop_reason": "tool_use" if reply.tool is not None else reply.stop_reason,
            "stop_sequence": None, "usage": reply.usage}, reply.headers)
