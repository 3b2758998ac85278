"""Anthropic's Messages API as a model provider, on the official ``anthropic`` SDK."""

from flows.model.anthropic.client import AnthropicModel

__all__ = ["AnthropicModel"]
