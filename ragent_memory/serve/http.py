"""HTTP plumbing every wire format of the proxy shares: the refusal it answers itself, the
request body read within its bound, and which headers cross the proxy each way."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from starlette.requests import Request
from starlette.responses import Response

# Hop-by-hop and proxy-own request headers; everything else the caller sent reaches the
# upstream (Authorization, OpenAI-Organization, api-key, …). The proxy reads the body whole, so
# it negotiates its own encoding and never asks to be told to go on (Expect).
# fmt: off
REQUEST_DROP = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer",
    "upgrade", "proxy-authorization", "proxy-connection", "accept-encoding", "expect",
    "x-session-id", "x-user-id",
})
# Bodies are relayed decoded and re-framed by the proxy's server.
RESPONSE_DROP = frozenset({
    b"content-length", b"content-encoding", b"transfer-encoding", b"connection", b"keep-alive",
    b"date", b"server",
})
# fmt: on

RawHeaders = list[tuple[bytes, bytes]]


CLOSE = (b"connection", b"close")


class Reject(Exception):
    """A request the proxy answers itself with an error status and one line (and ``headers``,
    e.g. ``CLOSE`` to end the connection after it)."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        self.status = status
        self.message = message
        self.kind = kind
        self.headers = tuple(headers)
        super().__init__(message)


async def read_body(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The request body, a 413 ``Reject`` past ``limit`` bytes (``serve.max_body_bytes``), before
    a byte is read when ``Content-Length`` says so; a 408 that closes the connection when it is
    not all in within ``timeout_s`` (``serve.body_timeout_s``); ``ClientDisconnect`` when the
    client leaves."""
    too_big = Reject(413, f"request body over {limit} bytes (serve.max_body_bytes)")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    parts = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for part in request.stream():
                size += len(part)
                if size > limit:
                    raise too_big
                parts.append(part)
    except TimeoutError:
        late = f"request body not received within {timeout_s:g} s (serve.body_timeout_s)"
        raise Reject(408, late, "timeout_error", [CLOSE]) from None
    return b"".join(parts)


def forward_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """The caller's request headers the upstream gets: all but hop-by-hop and proxy-own ones."""
    headers = ((name.decode("latin-1"), value) for name, value in raw)
    return [
        (name, value.decode("latin-1"))
        for name, value in headers
        if name.lower() not in REQUEST_DROP
    ]


def response_headers(
    items: Iterable[tuple[bytes, bytes]], ours: Sequence[tuple[bytes, bytes]] = ()
) -> RawHeaders:
    """The upstream's response headers to relay (every one, repeated ones included, but
    hop-by-hop ones and any the proxy sets itself), then the proxy's ``ours``."""
    dropped = RESPONSE_DROP.union(name for name, _ in ours)
    kept = [(name.lower(), value) for name, value in items]
    return [*((name, value) for name, value in kept if name not in dropped), *ours]


def whole_response(status: int, headers: RawHeaders, body: bytes) -> Response:
    """A response with exactly ``headers`` (repeats kept), then the body's length."""
    response = Response(body, status_code=status)
    if status >= 200 and status not in (204, 304):
        headers = [*headers, (b"content-length", b"%d" % len(body))]
    response.raw_headers = headers
    return response
