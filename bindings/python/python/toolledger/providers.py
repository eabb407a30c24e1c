"""Provider wire formats (OpenAI, Anthropic, Gemini, MCP): the library's
functions with errors translated into `toolledger.Error`s."""

from __future__ import annotations

from typing import Any, List

from ._native import toolledger as _ffi
from .errors import translated, translating

parse_tool_calls = translating(_ffi.parse_tool_calls)
render_tool_result = translating(_ffi.render_tool_result)
render_anthropic_user_message = translating(_ffi.render_anthropic_user_message)
render_gemini_user_turn = translating(_ffi.render_gemini_user_turn)
render_mcp_batch_response = translating(_ffi.render_mcp_batch_response)
render_mcp_result = translating(_ffi.render_mcp_result)
mcp_request_protocol_version = translating(_ffi.mcp_request_protocol_version)


class ToolCallStream:
    """Assembles the tool calls of one streamed model response: `push` each
    event's JSON payload in order; `finish` gives the calls once the
    provider's terminal event arrived."""

    def __init__(self, provider: Any, round: int) -> None:
        with translated():
            self._native = _ffi.ToolCallStream(provider, round)

    def push(self, chunk_json: str) -> None:
        """Feeds one event's JSON payload."""
        with translated():
            self._native.push(chunk_json)

    def is_complete(self) -> bool:
        """True once the provider's terminal event arrived."""
        with translated():
            return self._native.is_complete()

    def finish(self) -> List[Any]:
        """The assembled calls (`ToolCall`s)."""
        with translated():
            return self._native.finish()


__all__ = [
    "ToolCallStream",
    "mcp_request_protocol_version",
    "parse_tool_calls",
    "render_anthropic_user_message",
    "render_gemini_user_turn",
    "render_mcp_batch_response",
    "render_mcp_result",
    "render_tool_result",
]
