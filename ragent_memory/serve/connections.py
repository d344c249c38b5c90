"""The proxy's connections, bounded before a request reaches the app: how long a caller may
take to send a request's head, and how many connections one client address may hold open.

uvicorn bounds neither (its keep-alive timeout covers only a connection idle between requests,
and any byte received ends it), and ASGI code first runs once a head is whole, so the bounds
sit in two places that share one :class:`Doorman`:

- :class:`Guarded`, the asyncio protocol uvicorn is given: it wraps uvicorn's own HTTP
  protocol (every call passed on), counts the connection against its peer's bound (past it: a
  429 and the connection closed before a byte is read) and arms the head deadline when the
  connection opens;
- :meth:`Doorman.app`, ASGI middleware: a request's head is in once the app is called (the
  deadline is disarmed), and the deadline is armed again when the last request running on the
  connection ends, for the next head.

A head that is not in by ``serve.header_timeout_s`` closes the connection (with a 408 when it
was the connection's first request; a 408 written later could be read as the answer to a
request the client is sending at that moment). The body's own deadline is the app's
(``serve.body_timeout_s``, ``app.Endpoint``).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
from collections.abc import Callable
from typing import Any, cast

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from ragent_memory.core.logs import get_logger

log = get_logger(__name__)

Peer = tuple[str, int]  # (address, port), as uvicorn puts it in the ASGI scope's "client"

_PEER_FULL = "too many open connections from this address (serve.max_connections_per_peer)"
_HEAD_LATE = "request head not received within serve.header_timeout_s"


def raw_response(status: bytes, message: str, kind: str) -> bytes:
    """A whole HTTP/1.1 error response (OpenAI-shaped) that closes its connection, written
    where no request is being answered."""
    body = orjson.dumps({"error": {"message": message, "type": kind}}) + b"\n"
    head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\nconnection: close\r\n" % status
    return head + b"content-length: %d\r\n\r\n%s" % (len(body), body)


class Doorman:
    """The bounds of one server's connections (see the module docstring)."""

    def __init__(
        self, *, per_peer: int, header_timeout_s: float, exempt: tuple[str, ...] = ()
    ) -> None:
        self.per_peer = per_peer
        self.header_timeout_s = header_timeout_s
        self.exempt = [ipaddress.ip_network(n, strict=False) for n in exempt]
        self.open: dict[str, int] = {}  # open connections per counted peer address
        self.refused = 0  # connections turned away past the per-peer bound
        self.timed_out = 0  # connections closed for a late head
        self._full: set[str] = set()  # peers at their bound now (logged once per episode)
        self._by_peer: dict[Peer, Guarded] = {}

    def protocol(self, inner: Callable[..., asyncio.Protocol]) -> Callable[..., asyncio.Protocol]:
        """What uvicorn's ``Config(http=…)`` takes: ``inner`` (uvicorn's HTTP protocol class)
        built as usual, wrapped in :class:`Guarded`."""
        return cast("Callable[..., asyncio.Protocol]", functools.partial(Guarded, self, inner))

    def app(self, app: ASGIApp) -> ASGIApp:
        """``app`` with the head deadline disarmed while a request of a connection runs."""

        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            client = scope.get("client") if scope["type"] == "http" else None
            connection = self._by_peer.get((str(client[0]), int(client[1]))) if client else None
            if connection is None:
                await app(scope, receive, send)
                return
            connection.started()
            try:
                await app(scope, receive, send)
            finally:
                connection.ended()

        return guarded

    def _counted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return True
        ip = getattr(ip, "ipv4_mapped", None) or ip  # ::ffff:a.b.c.d on a dual stack
        return not any(ip in network for network in self.exempt)

    def admit(self, peer: Peer, connection: Guarded) -> bool:
        """Count ``connection`` of ``peer``; False (nothing counted) past the peer's bound."""
        address = peer[0]
        if self._counted(address):
            if self.open.get(address, 0) >= self.per_peer:
                self.refused += 1
                if address not in self._full:
                    self._full.add(address)
                    log.warning("serve.peer_connections_full", peer=address, bound=self.per_peer)
                return False
            self.open[address] = self.open.get(address, 0) + 1
        self._by_peer[peer] = connection
        return True

    def release(self, peer: Peer) -> None:
        """``peer``'s connection is closed."""
        if self._by_peer.pop(peer, None) is None:
            return
        address = peer[0]
        if address in self.open:
            self.open[address] -= 1
            if self.open[address] <= 0:
                del self.open[address]
            if self.open.get(address, 0) < self.per_peer:
                self._full.discard(address)


class Guarded(asyncio.Protocol):
    """One connection: uvicorn's protocol for it (``inner``), behind the :class:`Doorman`'s
    per-peer bound and head deadline."""

    def __init__(
        self, doorman: Doorman, inner: Callable[..., asyncio.Protocol], **kwargs: Any
    ) -> None:
        self.doorman = doorman
        self.inner = inner(**kwargs)
        self.loop = kwargs.get("_loop") or asyncio.get_event_loop()
        self.transport: asyncio.Transport | None = None
        self.peer: Peer | None = None
        self.refused = False  # past the per-peer bound: answered 429, never handed on
        self.running = 0  # requests of this connection in the app now
        self.served = 0  # requests that reached the app
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)
        info = transport.get_extra_info("peername")
        self.peer = (str(info[0]), int(info[1])) if isinstance(info, tuple) else None
        if self.peer is not None and not self.doorman.admit(self.peer, self):
            self.refused = True
            self.transport.write(
                raw_response(b"429 Too Many Requests", _PEER_FULL, "rate_limit_error")
            )
            self.transport.close()
            return
        self.inner.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not self.refused:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self.refused else self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.refused:  # uvicorn's protocol never saw it
            return
        if self.peer is not None:
            self.doorman.release(self.peer)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def started(self) -> None:
        """A request's head is in: the app runs it."""
        self.running += 1
        self.served += 1
        self._disarm()

    def ended(self) -> None:
        """A request left the app: the next head is awaited (when none other runs)."""
        self.running -= 1
        if self.running == 0:
            self._arm()

    def _arm(self) -> None:
        self._disarm()
        if self.transport is not None and not self.transport.is_closing():
            self._deadline = self.loop.call_later(self.doorman.header_timeout_s, self._late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _late(self) -> None:
        self._deadline = None
        if self.running or self.transport is None or self.transport.is_closing():
            return
        self.doorman.timed_out += 1
        if self.served == 0:
            self.transport.write(raw_response(b"408 Request Timeout", _HEAD_LATE, "timeout_error"))
            log.info("serve.header_timeout", peer=self.peer[0] if self.peer else None)
        self.transport.close()
