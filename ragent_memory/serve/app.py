"""``ragent-memory serve``: the engine in front of any model (docs/design.md §14b), in three wire
formats on one port: ``POST /v1/chat/completions`` (``chat``), ``POST /v1/messages``
(``anthropic``) and ``POST /v1/responses`` (``responses``).

An app changes only its base URL. Per request (chat completions drawn)::

    app ──history──▶ proxy: prepare(history)  (session: X-Session-Id or ``user``, scoped per key)
                       │   + recall_tool_result / search_memory when the view needs them
                       ▼
                     upstream {upstream}/chat/completions  (the caller's own Authorization)
                       │   calls of the proxy's own tools answered here, upstream asked again
                       ▼
    app ◀──reply unchanged (SSE chunk by chunk)──   then after_turn(history + reply), off the path

Every request carries the app's whole history; the proxy keeps the engine's store and, in
memory, each session's last body (``bodies``). The caller's headers reach the upstream and are
never logged or stored. ``X-Ragent-*`` response headers carry the ``TurnReport`` figures.
A request the engine cannot manage (a Responses chain kept by the provider) and
``/v1/messages/count_tokens`` are forwarded untouched (``X-Ragent-Managed: false``).
This module: the Starlette app, its routes, a request's bounds, running it under uvicorn
(behind ``connections``: each head in time, connections per client address bounded).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, cast

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ragent_memory.core.chars import Message
from ragent_memory.core.logs import get_logger
from ragent_memory.serve import chat
from ragent_memory.serve.anthropic import AnthropicWire
from ragent_memory.serve.connections import Doorman
from ragent_memory.serve.http import (
    Reject,
    forward_headers,
    read_body,
    response_headers,
    whole_response,
)
from ragent_memory.serve.identity import TrustedPeers, credential_of
from ragent_memory.serve.responses import ResponsesWire
from ragent_memory.serve.stream import Relay
from ragent_memory.serve.turn import Origin, Proxy
from ragent_memory.serve.wire import Wire
from ragent_memory.settings import ServeSettings, Settings, is_loopback

if TYPE_CHECKING:
    from ragent_memory.engine.memory_engine import MemoryEngine


log = get_logger(__name__)

UNMANAGED = (b"x-ragent-managed", b"false")
_SEGMENT_SAFE = "!$&'()*+,;=:@-._~"  # what a path segment may hold unencoded (RFC 3986 pchar)


class Endpoint:
    """``POST`` of one wire format: each body within ``serve.max_body_bytes`` and, whole, within
    ``serve.body_timeout_s`` (a 408 that closes the connection); then at most
    ``serve.max_concurrency`` requests in flight (a 503 with ``Retry-After`` past it, shared by
    every format)."""

    def __init__(self, proxy: Proxy, wire: Wire) -> None:
        self.proxy = proxy
        self.wire = wire

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        settings = self.proxy.settings
        request = Request(scope, receive)
        try:  # a body still arriving holds no slot: a slow sender locks nobody out
            raw = await read_body(request, settings.max_body_bytes, settings.body_timeout_s)
        except Reject as err:
            await self.wire.error(err.status, err.message, err.kind, err.headers)(
                scope, receive, send
            )
            return
        except ClientDisconnect:
            return
        if self.proxy.in_flight >= settings.max_concurrency:
            busy = f"busy: {self.proxy.in_flight} requests in flight (serve.max_concurrency); retry"
            retry = [(b"retry-after", b"1")]
            await self.wire.error(503, busy, "server_busy", retry)(scope, receive, send)
            return
        self.proxy.in_flight += 1
        try:
            await self._serve(request, raw, send, started)
        finally:
            self.proxy.in_flight -= 1

    async def _serve(self, request: Request, raw: bytes, send: Send, started: float) -> None:
        scope, receive = request.scope, request.receive
        reply: Message | None = None
        try:
            forward = forward_headers(scope["headers"])
            key = (
                self.wire.name,
                credential_of(request.headers),
                request.headers.get("x-session-id"),
            )
            body = self.proxy.bodies.parse(key, raw, self.wire.field, self.wire.parse)
            query = scope.get("query_string", b"").decode("latin-1")
            path = self.wire.path + (f"?{query}" if query else "")
            if not self.wire.managed(body):
                passed = await forward_untouched(self.proxy, self.wire, path, forward, raw)
                await passed(scope, receive, send)
                return
            headers = request.headers
            origin = Origin(key, len(raw), query)
            turn = await self.proxy.turn(self.wire, body, headers, forward, started, origin)
            if turn.body.get("stream") is True:
                answer = await self.proxy.stream(turn)
                if isinstance(answer, Relay):  # it tells the proxy when it is done
                    await answer(scope, receive, send)
                    return
            else:
                answer, reply = await self.proxy.complete(turn)
        except Reject as err:
            await self.wire.error(err.status, err.message, err.kind)(scope, receive, send)
            return
        except ClientDisconnect:
            return
        try:
            await answer(scope, receive, send)
        finally:  # after the response: after_turn's thread must not hold it up
            self.proxy.done(turn, reply, answer.status_code)


async def forward_untouched(
    proxy: Proxy, wire: Wire, path: str, forward: list[tuple[str, str]], raw: bytes
) -> Response:
    """The request as it came to the upstream and its answer back as it arrives, the engine
    not involved (``X-Ragent-Managed: false``)."""
    base = proxy.settings.upstream_for(wire.provider)
    upstream = await proxy.upstream.open("POST", path, forward, raw, base=base)
    headers = response_headers(upstream.raw_headers, [UNMANAGED])

    async def body() -> AsyncIterator[bytes]:
        try:
            async for data in upstream.content.iter_any():
                yield data
        finally:
            upstream.release()

    response = StreamingResponse(body(), status_code=upstream.status)
    response.raw_headers = headers
    return response


def models_path(model: str | None) -> str:
    """The upstream path of ``/v1/models`` or ``/v1/models/{model}`` (``model`` decoded, as
    routed): each segment encoded again on its own, so a ``..`` that came encoded is still a
    ``..`` segment, which the upstream client refuses."""
    if model is None:
        return "/models"
    return "/models/" + "/".join(
        urllib.parse.quote(p, safe=_SEGMENT_SAFE) for p in model.split("/")
    )


async def healthz(request: Request) -> Response:
    return Response(b'{"status":"ok"}\n', media_type="application/json")


def create_app(settings: Settings, *, engine: MemoryEngine | None = None) -> Starlette:
    """The ASGI app. It owns (and closes) the engine unless one is passed in."""
    from ragent_memory.engine.memory_engine import MemoryEngine

    owned = engine is None
    proxy = Proxy(engine or MemoryEngine(settings), settings.serve)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await proxy.start()
        try:
            yield
        finally:
            await proxy.stop()
            if owned:
                await asyncio.to_thread(proxy.engine.close)

    anthropic = AnthropicWire()

    async def count_tokens(request: Request) -> Response:
        """``POST /v1/messages/count_tokens`` passed through (the app's body, as sent)."""
        try:
            settings = proxy.settings
            raw = await read_body(request, settings.max_body_bytes, settings.body_timeout_s)
            base = settings.upstream_for(anthropic.provider)
            forward = forward_headers(request.headers.raw)
            path = anthropic.path + "/count_tokens"
            if request.url.query:
                path += f"?{request.url.query}"
            reply, _ = await proxy.upstream.call("POST", path, forward, raw, base=base)
        except Reject as err:
            return anthropic.error(err.status, err.message, err.kind, err.headers)
        headers = response_headers(reply.headers, [UNMANAGED])
        return whole_response(reply.status_code, headers, reply.content)

    async def models(request: Request) -> Response:
        """``GET /v1/models`` (and ``/v1/models/{id}``) passed through."""
        path = models_path(request.path_params.get("model"))
        try:
            reply, _ = await proxy.upstream.call("GET", path, forward_headers(request.headers.raw))
        except Reject as err:
            return chat.error_response(err.status, err.message, err.kind)
        return whole_response(reply.status_code, response_headers(reply.headers), reply.content)

    routes = [
        Route("/v1/chat/completions", Endpoint(proxy, chat.ChatWire()), methods=["POST"]),
        Route("/v1/messages", Endpoint(proxy, anthropic), methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/responses", Endpoint(proxy, ResponsesWire()), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", models, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
    ]
    peers = proxy.settings.trusted_proxies
    guard = [Middleware(TrustedPeers, networks=peers)] if peers else []
    return Starlette(routes=routes, lifespan=lifespan, middleware=guard)


def serve(
    settings: Settings,
    *,
    verbose: bool = False,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Run the proxy under uvicorn until SIGINT/SIGTERM; ``ready`` gets the base URL once the
    socket listens."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol  # what uvicorn itself picks

    config = settings.serve  # the socket first: it listens (port 0: a free one) once told
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.create_server((config.host, config.port), family=family, backlog=2048)
    host, port = sock.getsockname()[:2]
    warn_if_exposed(config)
    doorman = Doorman(
        per_peer=config.max_connections_per_peer,
        header_timeout_s=config.header_timeout_s,
        exempt=config.trusted_proxies,
    )
    server = uvicorn.Server(
        uvicorn.Config(
            doorman.app(create_app(settings)),
            http=cast("type[asyncio.Protocol]", doorman.protocol(AutoHTTPProtocol)),
            log_level="info" if verbose else "warning",
            access_log=verbose,
            timeout_graceful_shutdown=30,
            h11_max_incomplete_event_size=64 * 1024,
            proxy_headers=False,  # the peer's own address: what the per-peer bound counts
        )
    )
    if ready is not None:
        shown = f"[{host}]" if ":" in host else host
        ready(f"http://{shown}:{port}/v1")
    with contextlib.closing(sock):
        server.run(sockets=[sock])


def warn_if_exposed(config: ServeSettings) -> None:
    """Warnings for a server others can reach (a host beyond loopback) without the guards that
    setting needs: anonymous requests served, or plain HTTP with no trusted proxy in front."""
    if is_loopback(config.host):
        return
    if config.allow_anonymous:
        log.warning(
            "serve.anonymous_beyond_loopback",
            host=config.host,
            risk="anyone who reaches this port reads and writes one shared memory without a key",
            fix="serve.allow_anonymous: false, or serve.host: 127.0.0.1",
        )
    if not config.trusted_proxies:
        log.warning(
            "serve.plain_http_beyond_loopback",
            host=config.host,
            risk="API keys and conversations cross the network unencrypted; any peer may connect",
            fix="a TLS terminator in front and serve.trusted_proxies naming it (docs/proxy.md)",
        )


def shown_url(url: str) -> str:
    """``url`` without any user:password part, for logs and the ready line."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
