"""Who a proxy request speaks for (docs/design.md §14b): the one place that decides it.

``serve.identity: credential`` (default): the request's key (``Authorization: Bearer``, else
``x-api-key``) names a scope, and every session and user id it names becomes ``SCOPE:id``
before the engine sees it, so all the engine keeps or answers is per key by construction; the
key itself is never kept. A scope is 24 hex digits (96 bits) of an HMAC-SHA-256 under a server
secret: a collision takes about 2**48 keys, and without the secret none can be computed.
``headers``: the ids as sent, for a gateway that authenticates and sets them itself.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ragent_memory.core.logs import get_logger
from ragent_memory.serve import chat
from ragent_memory.serve.http import Reject
from ragent_memory.settings import ServeSettings

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from ragent_memory.serve.wire import Wire
    from ragent_memory.store import HostMeta

log = get_logger(__name__)

SCOPE_HEX = 24
ANONYMOUS = "anonymous"  # the one scope of requests without a key (serve.allow_anonymous)
NO_CREDENTIAL = (
    "no credential: send your API key (Authorization: Bearer …, or x-api-key); this proxy "
    "keeps each key's memory apart (serve.identity: credential)"
)


def scope_of(secret: bytes, credential: str) -> str:
    """The scope of ``credential`` under the server ``secret``."""
    mac = hmac.new(secret, credential.encode("utf-8", "surrogatepass"), "sha256")
    return mac.hexdigest()[:SCOPE_HEX]


def is_scope(text: str) -> bool:
    return text == ANONYMOUS or (len(text) == SCOPE_HEX and text.strip("0123456789abcdef") == "")


def credential_of(headers: Mapping[str, str]) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get("x-api-key") or headers.get("api-key") or None


class Identity:
    """Scopes a request's ids (see the module docstring)."""

    def __init__(self, settings: ServeSettings, store: HostMeta) -> None:
        self.settings = settings
        self._secret = b""
        if settings.identity == "credential":
            self._secret = settings.secret() or store.scope_secret()
        else:
            log.warning("serve.identity_from_headers", trusted=list(settings.trusted_proxies))

    def identify(
        self, headers: Mapping[str, str], body: Mapping[str, Any], wire: Wire | None = None
    ) -> tuple[str, str | None]:
        """``(session_id, user_id)`` as the engine gets them (as the request's ``wire`` names
        them, chat completions' way by default, then scoped); a 401 without a credential."""
        ids = wire.ids if wire is not None else chat.identify
        if self.settings.identity == "headers":
            return ids(headers, body)
        credential = credential_of(headers)
        if credential is None and not self.settings.allow_anonymous:
            raise Reject(401, NO_CREDENTIAL, "authentication_error")
        scope = ANONYMOUS if credential is None else scope_of(self._secret, credential)
        session_id, user_id = ids(headers, body)
        return f"{scope}:{session_id}", None if user_id is None else f"{scope}:{user_id}"


class TrustedPeers:
    """ASGI middleware: a 403 for a peer outside ``serve.trusted_proxies`` but on /healthz."""

    def __init__(self, app: ASGIApp, networks: tuple[str, ...]) -> None:
        self.app = app
        self.networks = [ipaddress.ip_network(n, strict=False) for n in networks]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/healthz" and not self._admits(scope):
            refused = "this peer is not in serve.trusted_proxies"
            await chat.error_response(403, refused, "permission_error")(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _admits(self, scope: Scope) -> bool:
        try:
            peer = ipaddress.ip_address((scope.get("client") or ("",))[0])
        except ValueError:
            return False
        peer = getattr(peer, "ipv4_mapped", None) or peer  # ::ffff:a.b.c.d on a dual stack
        return any(peer in network for network in self.networks)
