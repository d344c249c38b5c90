"""``ragent-memory ui``: the audit page, server-rendered (Jinja2 templates shipped in the
package, no script, nothing fetched from the network), read-only but for forgetting one fact.

Pages: ``/`` the sessions, ``/session?id=`` one session (context per turn, each generation
and its diff), ``/probes?session=`` what survived, ``/message?session=&position=`` one raw
message, ``/user?id=`` a user's facts, ``/forget?user=&fact=`` the confirmation a forget
needs (a POST to it forgets).

Access: with ``token`` set, every request carries it (``Authorization: Bearer``, the cookie
the page sets, or ``?token=`` once, which sets that cookie); compared in constant time. A
forget also needs the form's per-process anti-forgery value.
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
import socket
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, Final

import attrs
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from ragent_memory.audit import OUTCOMES
from ragent_memory.errors import StoreError
from ragent_memory.settings import Settings
from ragent_memory.ui.chart import context_chart
from ragent_memory.ui.pages import NotFound, Pages, PageStore

COOKIE: Final = "ragent_memory_ui"
Handler = Callable[[Request], Awaitable[Response]]


def link(path: str, **params: Any) -> str:
    """``path`` with ``params`` as its query string (None values left out)."""
    given = {k: v for k, v in params.items() if v is not None}
    return f"{path}?{urllib.parse.urlencode(given)}" if given else path


@attrs.frozen
class Guard:
    """Who may read the page: anyone reaching the socket, or a holder of ``token``."""

    token: str | None
    form_key: str = attrs.field(factory=lambda: secrets.token_urlsafe(24))

    def admits(self, request: Request) -> bool:
        if self.token is None:
            return True
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        given = [request.cookies.get(COOKIE, ""), request.query_params.get("token", "")]
        if scheme.lower() == "bearer":
            given.append(bearer.strip())
        expected = self.token.encode()
        return any(hmac.compare_digest(g.encode(), expected) for g in given if g)

    def form_ok(self, value: str) -> bool:
        return hmac.compare_digest(value.encode(), self.form_key.encode())


class AuditPage:
    """The page's handlers over one store (see the module docstring)."""

    def __init__(self, pages: Pages, guard: Guard) -> None:
        self.pages = pages
        self.guard = guard
        self.templates = Environment(
            loader=PackageLoader("ragent_memory.ui", "templates"),
            autoescape=select_autoescape(["html"]),
        )
        self.templates.globals.update(link=link, outcomes=OUTCOMES, scope=pages.scope)

    def render(self, name: str, status: int = 200, **values: Any) -> HTMLResponse:
        html = self.templates.get_template(name).render(**values)
        return HTMLResponse(html, status_code=status)

    def guarded(self, handler: Handler) -> Handler:
        """``handler`` behind the token; a missing page or a store failure is a page too."""

        async def guarded(request: Request) -> Response:
            if not self.guard.admits(request):
                return self.render("error.html", 401, message="this page needs its token")
            if self.guard.token is not None and "token" in request.query_params:
                return self._remember_token(request)
            try:
                return await handler(request)
            except NotFound as err:
                return self.render("error.html", 404, message=f"not found: {err}")
            except (StoreError, ValueError) as err:
                return self.render("error.html", 400, message=str(err))

        return guarded

    def _remember_token(self, request: Request) -> Response:
        """A ``?token=`` link: the token moves to a cookie and off the address bar."""
        rest = {k: v for k, v in request.query_params.items() if k != "token"}
        response = RedirectResponse(link(request.url.path, **rest), status_code=303)
        response.set_cookie(COOKIE, self.guard.token or "", httponly=True, samesite="strict")
        return response

    async def sessions(self, request: Request) -> Response:
        query = request.query_params.get("q", "")
        rows = self.pages.sessions(query)
        return self.render("sessions.html", sessions=rows, query=query)

    async def session(self, request: Request) -> Response:
        found = self.pages.session(_param(request, "id"))
        chart = Markup(context_chart(found["turns"]))
        probes = self.pages.probes(found["session_id"])
        counts = {g.generation: g.counts() for g in probes.generations}
        return self.render("session.html", s=found, chart=chart, counts=counts, probes=probes)

    async def probes(self, request: Request) -> Response:
        session_id = _param(request, "session")
        return self.render("probes.html", probes=self.pages.probes(session_id))

    async def message(self, request: Request) -> Response:
        session_id = _param(request, "session")
        position = _number(request, "position")
        return self.render("message.html", m=self.pages.message(session_id, position))

    async def user(self, request: Request) -> Response:
        user_id = _param(request, "id")
        forgot = request.query_params.get("forgot")
        facts = self.pages.facts(user_id)
        return self.render("user.html", user_id=user_id, facts=facts, forgot=forgot)

    async def forget(self, request: Request) -> Response:
        """GET: the confirmation; POST with the form's key: forget that one fact."""
        if request.method == "GET":
            user_id, fact_id = _param(request, "user"), _number(request, "fact")
            fact = self.pages.fact(user_id, fact_id)
            return self.render("confirm.html", user_id=user_id, fact=fact, key=self.guard.form_key)
        form = await request.form()
        user_id, fact_id = str(form.get("user", "")), _int(form.get("fact"), "fact")
        if not self.guard.form_ok(str(form.get("key", ""))):
            return self.render("error.html", 403, message="the form expired: open it again")
        self.pages.forget(user_id, fact_id)
        return RedirectResponse(link("/user", id=user_id, forgot=fact_id), status_code=303)

    async def healthz(self, request: Request) -> Response:
        return Response("ok", media_type="text/plain")


def _param(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if not value:
        raise ValueError(f"the address needs ?{name}=")
    return value


def _number(request: Request, name: str) -> int:
    return _int(request.query_params.get(name), name)


def _int(value: Any, name: str) -> int:
    try:
        return int(str(value))
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {value!r}") from None


def create_app(
    store: PageStore, settings: Settings, *, scope: str | None = None, token: str | None = None
) -> Starlette:
    """The ASGI app over ``store`` (which the caller owns and closes)."""
    page = AuditPage(Pages(store, settings, scope), Guard(token))
    routes = [
        Route("/", page.guarded(page.sessions)),
        Route("/session", page.guarded(page.session)),
        Route("/probes", page.guarded(page.probes)),
        Route("/message", page.guarded(page.message)),
        Route("/user", page.guarded(page.user)),
        Route("/forget", page.guarded(page.forget), methods=["GET", "POST"]),
        Route("/healthz", page.healthz),
    ]
    return Starlette(routes=routes)


def serve(app: Starlette, host: str, port: int, ready: Callable[[str], None]) -> None:
    """Run ``app`` under uvicorn until SIGINT/SIGTERM; ``ready`` gets the page's address once
    the socket listens (port 0: a free one)."""
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family)
    bound_host, bound_port = sock.getsockname()[:2]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    ready(f"http://{shown}:{bound_port}/")
    with contextlib.closing(sock):
        server.run(sockets=[sock])
