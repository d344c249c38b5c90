"""Server-sent events of a streamed chat completion, for the proxy (DESIGN §14b).

The proxy forwards an upstream stream byte for byte; it only needs to *read* along: split the
bytes into events (:class:`EventSplitter`), look at each event's JSON chunk (:func:`chunk_of`)
and rebuild the assistant message the client received (:class:`ReplyBuilder`), so that
``after_turn`` sees the reply. Plain functions over bytes and dicts, testable alone.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

DONE = "[DONE]"
_TERMINATOR = re.compile(rb"\r\n\r\n|\n\n|\r\r")  # the first to end wins: the leftmost


class EventSplitter:
    """Cuts a byte stream into complete events, each with its blank-line terminator, in the
    order and with the bytes they arrived in (so joining them gives the stream back)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer + data
        events = []
        start = 0
        for end in _TERMINATOR.finditer(buffer):
            events.append(buffer[start : end.end()])
            start = end.end()
        self._buffer = buffer[start:]
        return events

    def rest(self) -> bytes:
        """What arrived after the last complete event (an unterminated tail, usually b"")."""
        rest, self._buffer = self._buffer, b""
        return rest


def data_of(event: bytes) -> str | None:
    """The event's ``data:`` lines joined by newlines, or None when it has none."""
    lines = []
    for line in event.decode("utf-8", "replace").splitlines():
        if line.startswith("data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(" ") else value)
    return "\n".join(lines) if lines else None


def chunk_of(event: bytes) -> dict[str, Any] | None:
    """The JSON chunk an event carries; None for comments, ``[DONE]`` and non-JSON data."""
    data = data_of(event)
    if data is None or data.strip() == DONE:
        return None
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return chunk if isinstance(chunk, dict) else None


def encode(chunk: dict[str, Any]) -> bytes:
    """One event carrying ``chunk``, as OpenAI-compatible servers write it."""
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def deltas(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``delta`` of every choice of the first index in a chunk (the proxy follows one
    choice; ``n > 1`` streams are forwarded untouched)."""
    out = []
    for choice in chunk.get("choices") or ():
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            delta = choice.get("delta")
            if isinstance(delta, dict):
                out.append(delta)
    return out


class ReplyBuilder:
    """Accumulates the deltas of choice 0 into the assistant message they spell."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        for delta in deltas(chunk):
            content = delta.get("content")
            if isinstance(content, str):
                self._text.append(content)
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    self._add_call(call)

    def _add_call(self, call: dict[str, Any]) -> None:
        index = call.get("index", len(self._calls))
        slot = self._calls.setdefault(
            index if isinstance(index, int) else len(self._calls),
            {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
        )
        if isinstance(call.get("id"), str):
            slot["id"] = call["id"]
        function = call.get("function")
        if isinstance(function, dict):
            for key in ("name", "arguments"):
                if isinstance(function.get(key), str):
                    slot["function"][key] += function[key]

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._text) or None}
        if self._calls:
            message["tool_calls"] = [self._calls[i] for i in sorted(self._calls)]
        elif message["content"] is None:
            message["content"] = ""
        return message
