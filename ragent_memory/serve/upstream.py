"""The proxy's client for its hot path (``serve``): a POST whose whole response is read, over
kept-alive HTTP/1.1 connections to a plain ``http://`` upstream.

aiohttp spends ~200 µs of CPU a request in Python (request and response objects, URL and
header handling, timers); this spends ~50 µs: the request head is joined once, the response is
parsed by ``httptools`` (C, as uvicorn's server side), and a connection is a bare protocol.
Streamed completions, ``https://`` upstreams (or ones with credentials or a query in the URL)
and the other routes keep aiohttp, which ``serve`` uses for them.

Bounds as aiohttp had them: ``connect_s`` to open a connection, ``read_s`` between two reads
of the response (``TimeoutError``). A connection the upstream closed while it sat idle is
noticed when the request meets it: the request is sent once more on a new connection, only
when not a byte of the response had arrived. Bodies are asked for without compression
(``Accept-Encoding: identity``); a gzip or deflate body sent anyway is decoded.
"""

from __future__ import annotations

import asyncio
import urllib.parse
import zlib
from collections.abc import Sequence
from typing import cast

import attrs
import httptools


class UpstreamBroke(ConnectionError):
    """The connection failed or closed before the whole response had arrived."""


@attrs.frozen
class Reply:
    """A whole upstream response: headers as received (names as sent), the body decoded."""

    status_code: int
    headers: list[tuple[bytes, bytes]]
    content: bytes


def lean_target(url: str) -> tuple[str, int, str] | None:
    """``(host, port, base path)`` of an upstream this client serves, None for the others
    (``https``, credentials, a query or fragment in the URL)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or parts.username or parts.password or parts.query:
        return None
    if parts.fragment or not parts.hostname:
        return None
    try:
        port = parts.port or 80
    except ValueError:
        return None
    return parts.hostname, port, parts.path.rstrip("/")


class _Connection(asyncio.Protocol):
    """One kept-alive connection; one request at a time."""

    def __init__(self, read_s: float) -> None:
        self.read_s = read_s
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.received = False  # a byte of the current response has arrived
        self._waiter: asyncio.Future[Reply] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._keep = False
        self._until_close = False  # the body ends when the connection does (no length)

    # ---- the caller's side

    def request(self, data: Sequence[bytes]) -> asyncio.Future[Reply]:
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        self.received = False
        self._headers, self._body = [], []
        self._until_close = self._keep = False
        self.transport.writelines(data)
        self._timer = loop.call_later(self.read_s, self._timed_out)
        return self._waiter

    @property
    def reusable(self) -> bool:
        return self._keep and not self.closed and self._waiter is None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # ---- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # bytes nobody asked for: the connection is not clean
            self.close()
            return
        self.received = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = asyncio.get_running_loop().call_later(self.read_s, self._timed_out)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._fail(UpstreamBroke(f"malformed response: {err}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None:
            if self._until_close:
                self._finish()
            else:
                self._fail(UpstreamBroke("connection closed by the upstream"))

    # ---- httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        self._keep = self.parser.should_keep_alive()
        names = {name.lower() for name, _ in self._headers}
        self._until_close = (
            status >= 200
            and status not in (204, 304)
            and b"content-length" not in names
            and b"transfer-encoding" not in names
        )

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._until_close = False
        if self.parser.get_status_code() < 200:  # 100 Continue, 103 Early Hints: not the reply
            self._headers, self._body = [], []
            return
        self._finish()

    # ---- ending a request

    def _finish(self) -> None:
        waiter, self._waiter = self._waiter, None
        self._stop_timer()
        if waiter is None or waiter.done():
            return
        try:
            content = _decoded(self._headers, b"".join(self._body))
        except zlib.error as err:
            self._keep = False
            waiter.set_exception(UpstreamBroke(f"undecodable body: {err}"))
            return
        waiter.set_result(Reply(self.parser.get_status_code(), self._headers, content))

    def _fail(self, error: BaseException) -> None:
        waiter, self._waiter = self._waiter, None
        self._stop_timer()
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def _timed_out(self) -> None:
        self._timer = None
        self._fail(TimeoutError())

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _decoded(headers: Sequence[tuple[bytes, bytes]], content: bytes) -> bytes:
    encoding = b""
    for name, value in headers:
        if name.lower() == b"content-encoding":
            encoding = value.strip().lower()
    if encoding in (b"", b"identity"):
        return content
    if encoding in (b"gzip", b"x-gzip"):
        return zlib.decompress(content, 16 + zlib.MAX_WBITS)
    if encoding == b"deflate":
        try:
            return zlib.decompress(content)
        except zlib.error:
            return zlib.decompress(content, -zlib.MAX_WBITS)  # raw deflate, as some send it
    raise zlib.error(f"content-encoding {encoding.decode('latin-1')!r} is not supported")


class Client:
    """Kept-alive connections to one upstream (see the module doc); at most ``limit`` idle."""

    def __init__(
        self, host: str, port: int, base: str, *, limit: int, connect_s: float, read_s: float
    ) -> None:
        self.host, self.port, self.base = host, port, base
        self.limit, self.connect_s, self.read_s = limit, connect_s, read_s
        shown = f"[{host}]" if ":" in host else host
        self._host = (shown if port == 80 else f"{shown}:{port}").encode("idna")
        self._idle: list[_Connection] = []

    async def post(self, path: str, body: bytes, headers: Sequence[tuple[str, str]]) -> Reply:
        """POST ``body`` to ``base + path``; the whole response. ``TimeoutError`` past a
        bound; ``OSError`` (``UpstreamBroke`` among them) when the upstream cannot be reached
        or the connection broke."""
        head = [b"POST ", (self.base + path).encode("latin-1"), b" HTTP/1.1\r\nHost: ", self._host]
        for name, value in headers:
            head += (b"\r\n", name.encode("latin-1"), b": ", value.encode("latin-1"))
        head.append(b"\r\nAccept-Encoding: identity\r\nContent-Length: %d\r\n\r\n" % len(body))
        data = (b"".join(head), body)
        while self._idle:
            connection = self._idle.pop()
            if connection.closed:
                continue
            try:
                return await self._exchange(connection, data)
            except UpstreamBroke:
                if connection.received:
                    raise
                # closed while idle (the upstream's keep-alive ran out): a new connection
        return await self._exchange(await self._connect(), data)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_s):
            _, connection = await loop.create_connection(
                lambda: _Connection(self.read_s), self.host, self.port
            )
        return connection

    async def _exchange(self, connection: _Connection, data: Sequence[bytes]) -> Reply:
        try:
            reply = await connection.request(data)
        except BaseException:
            connection.close()
            raise
        if connection.reusable and len(self._idle) < self.limit:
            self._idle.append(connection)
        else:
            connection.close()
        return reply

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()
