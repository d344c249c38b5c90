"""A streamed reply relayed as it arrives, in any wire format (``wire``): server-sent events
split, read along (the JSON chunk each carries) and forwarded byte for byte.

Only events that say nothing yet (the role chunk, a message start) are held back; thinking and
reasoning stream live. A reply that starts with a call of a proxy tool is read to its end and,
when every call is the proxy's, answered and followed by the next round. Otherwise it streams through, any later
proxy-tool call cut out (the app never sees a tool it did not declare), and the events that end
the reply are held back until it is known whether the model called only the proxy's tools
after its text: then they are answered and the next round's events follow in the same stream,
numbered on from the first (``Cutter.follow``), so the app sees one ordinary reply.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import attrs
import orjson
from starlette.types import Receive, Scope, Send

from ragent_memory.core.chars import Message
from ragent_memory.core.logs import get_logger
from ragent_memory.serve.http import RawHeaders
from ragent_memory.serve.upstream import STREAM_ERRORS
from ragent_memory.serve.wire import Wire

log = get_logger(__name__)
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


def _is_done(event: bytes) -> bool:
    """The ``data: [DONE]`` event that ends a chat-completions stream."""
    return any(
        line.strip() == b"data: [DONE]" or line.strip() == b"data:[DONE]"
        for line in event.splitlines()
    )


def chunk_of(event: bytes) -> dict[str, Any] | None:
    """The JSON chunk an event's ``data:`` lines carry; None for comments, ``[DONE]`` and
    non-JSON data."""
    lines = []
    for line in event.decode("utf-8", "replace").splitlines():
        if line.startswith("data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(" ") else value)
    data = "\n".join(lines)
    if not lines or data.strip() == DONE:
        return None
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return chunk if isinstance(chunk, dict) else None


class RoundFailed(Exception):
    """The upstream refused a round of the proxy's own tools after the app's reply began."""


NextRound = Callable[[Message], Awaitable["aiohttp.ClientResponse | None"]]


class StreamReader:
    """Reads one upstream SSE stream: holds back the events that say nothing yet, decides
    whose reply it is, then yields the events as they come with proxy-tool calls cut out.
    ``next_round`` hears the model's whole reply at the end of each upstream stream and
    gives the stream that continues it, if any."""

    def __init__(
        self,
        upstream: aiohttp.ClientResponse,
        own: Mapping[str, Any],
        wire: Wire,
        next_round: NextRound | None = None,
    ) -> None:
        self.upstream = upstream
        self.own = own
        self.wire = wire
        self.next_round = next_round if own else None
        self.reply = wire.builder()  # what the client received
        self.full = wire.builder()  # the model's whole reply of the current round
        self._events = self._split()
        self._held: list[bytes] = []
        self._tail: list[tuple[bytes, dict[str, Any] | None]] = []  # the round's ending events
        self._cutter = wire.cutter(own)

    async def _split(self) -> AsyncIterator[bytes]:
        splitter = EventSplitter()
        async for data in self.upstream.content.iter_any():
            for event in splitter.feed(data):
                yield event
        if rest := splitter.rest():
            yield rest

    async def decide(self) -> str:
        """``"own"`` when the first substantive delta calls a proxy tool, else ``"pass"``."""
        if not self.own:
            return "pass"
        while (event := await anext(self._events, None)) is not None:
            self._held.append(event)
            chunk = chunk_of(event)
            if chunk is not None and (verdict := self.wire.verdict(chunk, self.own)) is not None:
                return verdict
        return "pass"

    async def drain(self) -> Message:
        """Read the rest of a reply that started with a proxy-tool call; the message it spells."""
        while (event := await anext(self._events, None)) is not None:
            self._held.append(event)
        builder = self.wire.builder()
        for event in self._held:
            if (chunk := chunk_of(event)) is not None:
                builder.add(chunk)
        return builder.message()

    async def events(self) -> AsyncIterator[bytes]:
        """The held events, then the rest of the stream, proxy-tool calls cut out; then
        each round that continues it; then the last round's ending events."""
        held, self._held = self._held, []
        for event in held:
            if out := self._filter(event):
                yield out
        while True:
            while (following := await anext(self._events, None)) is not None:
                if out := self._filter(following):
                    yield out
            if (
                self.next_round is None
                or (upstream := await self.next_round(self.full.message())) is None
            ):
                break
            self.close()
            self.upstream, self._events = upstream, self._split()
            self.full = self.wire.builder()
            dropped = sum(1 for _, chunk in self._tail if chunk is not None)
            self._cutter, self._tail = self._cutter.follow(dropped), []
        for out, chunk in self._tail:
            if chunk is not None:
                self.reply.add(chunk)
            yield out

    def _filter(self, event: bytes) -> bytes:
        chunk = chunk_of(event)
        if chunk is None:
            if self.next_round is not None and _is_done(event):
                self._tail.append((event, None))
                return b""
            return event
        self.full.add(chunk)
        cut = bool(self.own) and self._cutter.cut(chunk)
        if cut and not self.wire.has_substance(chunk):
            return b""
        out = self.wire.encode(chunk) if cut else event
        if self.next_round is not None and self.wire.ends(chunk):
            self._tail.append((out, chunk))
            return b""
        self.reply.add(chunk)
        return out

    def close(self) -> None:
        self.upstream.release()  # back to the pool when read whole; closed otherwise


@attrs.define
class Relay:
    """An ASGI response streaming the reader's events as they come; ``finish`` runs once, with
    the reply the client received, before the stream's last bytes (so the client's next
    request finds what the turn kept); with None when the stream broke or the client left."""

    reader: StreamReader
    headers: RawHeaders
    finish: Callable[[Message | None], None]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        finished = False
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            try:
                async for event in self.reader.events():
                    await send({"type": "http.response.body", "body": event, "more_body": True})
            except (*STREAM_ERRORS, RoundFailed) as err:
                log.warning("serve.stream_broken", error=type(err).__name__)
                said = str(err) if isinstance(err, RoundFailed) else type(err).__name__
                error = self.reader.wire.stream_error(f"upstream stream broke: {said}")
                await send({"type": "http.response.body", "body": error, "more_body": True})
            else:  # before the last bytes: the app's next request finds what this turn kept
                finished = True
                self.finish(self.reader.reply.message())
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away
            pass
        finally:
            self.reader.close()
            if not finished:
                self.finish(None)
