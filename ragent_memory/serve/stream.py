"""A streamed chat completion relayed as it arrives (server-sent events).

The proxy holds back only the events that say nothing yet (the role chunk). When the first
substantive delta is a call of a proxy tool, it reads that reply to its end; if every call in
it is the proxy's, it answers them and streams the next round instead, so the app sees one
ordinary reply. Once text (or an app tool call) has been forwarded, the reply streams through
as it comes and any proxy-tool call later in it is cut out of the events: the app never sees a
tool it did not declare.
"""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
from starlette.types import Receive, Scope, Send

from ragent_memory.core.logs import get_logger
from ragent_memory.serve import chat, sse
from ragent_memory.serve.http import RawHeaders
from ragent_memory.serve.upstream import STREAM_ERRORS

log = get_logger(__name__)


class StreamReader:
    """Reads one upstream SSE stream: holds back the events that say nothing yet, decides
    whose reply it is, then yields the events as they come with proxy-tool calls cut out."""

    def __init__(self, upstream: aiohttp.ClientResponse, own: Mapping[str, Any]) -> None:
        self.upstream = upstream
        self.own = own
        self.reply = sse.ReplyBuilder()  # what the client received
        self._chunks = upstream.content.iter_any()
        self._splitter = sse.EventSplitter()
        self._pending: collections.deque[bytes] = collections.deque()
        self._held: list[bytes] = []
        self._ended = False
        self._cutter = chat.CallCutter(own)

    async def _next(self) -> bytes | None:
        """The next complete event, None at the end of the stream."""
        while not self._pending:
            if self._ended:
                return None
            try:
                data = await anext(self._chunks)
            except StopAsyncIteration:
                self._ended = True
                if rest := self._splitter.rest():
                    self._pending.append(rest)
                continue
            self._pending.extend(self._splitter.feed(data))
        return self._pending.popleft()

    async def decide(self) -> str:
        """``"own"`` when the first substantive delta calls a proxy tool, else ``"pass"``."""
        if not self.own:
            return "pass"
        while (event := await self._next()) is not None:
            self._held.append(event)
            chunk = sse.chunk_of(event)
            verdict = chat.verdict(chunk, self.own) if chunk is not None else None
            if verdict is not None:
                return verdict
        return "pass"

    async def drain(self) -> chat.Message:
        """Read the rest of a reply that started with a proxy-tool call; the message it spells."""
        while (event := await self._next()) is not None:
            self._held.append(event)
        builder = sse.ReplyBuilder()
        for event in self._held:
            if (chunk := sse.chunk_of(event)) is not None:
                builder.add(chunk)
        return builder.message()

    async def events(self) -> AsyncIterator[bytes]:
        """The held events, then the rest of the stream, proxy-tool calls cut out."""
        held, self._held = self._held, []
        for event in held:
            if out := self._filter(event):
                yield out
        while (following := await self._next()) is not None:
            if out := self._filter(following):
                yield out

    def _filter(self, event: bytes) -> bytes:
        chunk = sse.chunk_of(event)
        if chunk is None:
            return event
        cut = bool(self.own) and self._cutter.cut(chunk)
        self.reply.add(chunk)
        if not cut:
            return event
        return sse.encode(chunk) if chat.has_substance(chunk) else b""

    def close(self) -> None:
        self.upstream.release()  # back to the pool when read whole; closed otherwise


class Relay:
    """An ASGI response streaming the reader's events to the client as they come (no
    Content-Length); ``finish`` runs exactly once, with the reply the client received (None
    when the stream broke or the client left)."""

    def __init__(
        self,
        reader: StreamReader,
        headers: RawHeaders,
        finish: Callable[[chat.Message | None], None],
    ) -> None:
        self.headers = headers
        self.reader = reader
        self.finish = finish

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        reply: chat.Message | None = None
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            try:
                async for event in self.reader.events():
                    await send({"type": "http.response.body", "body": event, "more_body": True})
            except STREAM_ERRORS as err:
                log.warning("serve.stream_broken", error=type(err).__name__)
                error = {"error": {"message": f"upstream stream broke: {type(err).__name__}"}}
                await send(
                    {"type": "http.response.body", "body": sse.encode(error), "more_body": True}
                )
            else:
                reply = self.reader.reply.message()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away
            reply = None
        finally:
            self.reader.close()
            self.finish(reply)
