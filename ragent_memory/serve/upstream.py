"""The proxy's one client for every upstream call (aiohttp): whole replies, streams and the
passed-through routes, over kept-alive connections.

Bounds: ``min(10 s, timeout_s)`` to open a connection, ``timeout_s`` between two reads of a
response. Failures become the ``Reject`` the app gets: 504 past a bound, 502 when the upstream
cannot be reached or its reply broke off. No cookie jar: an upstream's cookies go to the
caller they were set for, never to the next one. Every path is kept under the upstream's
base path (``target``): no ``..``, encoded or not, reaches it.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Sequence

import aiohttp
import attrs
import yarl

from ragent_memory.serve.http import RawHeaders, Reject

Headers = Sequence[tuple[str, str]]
STREAM_ERRORS = (TimeoutError, aiohttp.ClientError)  # a stream that broke while relayed


def target(base: str, path: str) -> yarl.URL:
    """``base`` + ``path`` (percent-encoded, maybe with a query): a 400 ``Reject`` naming the
    path when a segment of it, as sent, is ``.`` or ``..`` or holds a slash or a backslash once
    decoded, so no path leaves ``base``'s own; then the URL as aiohttp would make it."""
    sent = yarl.URL(base.rstrip("/") + path, encoded=True)
    root = yarl.URL(base, encoded=True).raw_path.rstrip("/")
    shown = path.partition("?")[0]
    for segment in sent.raw_path[len(root) :].split("/")[1:]:
        plain = urllib.parse.unquote(segment)
        if plain in (".", "..") or "/" in plain or "\\" in plain:
            message = f"path {shown!r}: segment {plain!r} would leave the upstream's base path"
            raise Reject(400, message)
    url = yarl.URL(base.rstrip("/") + path)  # encoded as before; no dot segment is left
    if not (sent.raw_path.startswith(root + "/") and url.raw_path.startswith(root + "/")):
        raise Reject(400, f"path {shown!r}: not under the upstream's base path {root or '/'!r}")
    return url


@attrs.frozen
class Reply:
    """A whole upstream response: headers as received (names as sent), the body decoded."""

    status_code: int
    headers: RawHeaders
    content: bytes


class Upstream:
    """One aiohttp session to ``base`` (``start`` inside the event loop, ``close`` at the end)."""

    def __init__(self, base: str, *, timeout_s: float, limit: int) -> None:
        self.base = base.rstrip("/")
        self.timeout_s = timeout_s
        self.limit = limit
        self._session: aiohttp.ClientSession | None = None

    def start(self) -> None:
        timeout = aiohttp.ClientTimeout(
            total=None, connect=min(10.0, self.timeout_s), sock_read=self.timeout_s
        )
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.limit),
            timeout=timeout,
            trust_env=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("Content-Type", "User-Agent"),  # the caller's, as sent
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _timed_out(self) -> Reject:
        return Reject(504, f"upstream timed out after {self.timeout_s:g} s", "upstream_error")

    async def open(
        self,
        method: str,
        path: str,
        headers: Headers,
        body: bytes | None = None,
        *,
        base: str | None = None,
    ) -> aiohttp.ClientResponse:
        """The response to one request (to ``base`` instead of the default one when given),
        its headers read; the caller releases it."""
        if self._session is None:
            raise RuntimeError("the proxy is not started")
        url = target(base or self.base, path)
        try:
            return await self._session.request(method, url, data=body, headers=list(headers))
        except TimeoutError as err:
            raise self._timed_out() from err
        except aiohttp.ClientError as err:
            message = f"upstream unreachable: {type(err).__name__}"
            raise Reject(502, message, "upstream_error") from err

    async def read(self, response: aiohttp.ClientResponse) -> Reply:
        """The rest of ``response``, whole; the connection goes back to the pool."""
        try:
            content = await response.read()
        except TimeoutError as err:
            raise self._timed_out() from err
        except aiohttp.ClientError as err:
            message = f"upstream reply broke: {type(err).__name__}"
            raise Reject(502, message, "upstream_error") from err
        finally:
            response.release()
        return Reply(response.status, list(response.raw_headers), content)

    async def call(
        self,
        method: str,
        path: str,
        headers: Headers,
        body: bytes | None = None,
        *,
        base: str | None = None,
    ) -> tuple[Reply, float]:
        """One whole exchange, and the seconds it took."""
        sent = time.perf_counter()
        reply = await self.read(await self.open(method, path, headers, body, base=base))
        return reply, time.perf_counter() - sent
