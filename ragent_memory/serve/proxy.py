"""``ragent-memory serve``: the engine in front of any OpenAI-compatible model (DESIGN §14b).

An app changes only its ``base_url``. Per ``POST /v1/chat/completions``::

    app ──history──▶ proxy: prepare(history)  (session: X-Session-Id or ``user``)
                       │   + recall_tool_result / search_memory when the view needs them
                       ▼
                     upstream {upstream}/chat/completions  (the caller's own Authorization)
                       │   calls of the proxy's own tools answered here, upstream asked again
                       ▼
    app ◀──reply unchanged (SSE chunk by chunk)──   then after_turn(history + reply), off the path

The API is stateless: every request carries the app's whole history, so the proxy keeps
nothing but the engine's store. The caller's headers are forwarded to the upstream and never
logged or stored. ``X-Ragent-*`` response headers carry the ``TurnReport`` figures.

Streaming and the proxy's tools: the proxy holds back only the events that say nothing yet
(the role chunk). When the first substantive delta is a call of a proxy tool, it reads that
reply to its end; if every call in it is the proxy's, it answers them and streams the next
round instead, so the app sees one ordinary reply. Once text (or an app tool call) has been
forwarded, the reply streams through as it comes and any proxy-tool call later in it is cut
out of the events: the app never sees a tool it did not declare.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import ctypes.util
import functools
import itertools
import json
import operator
import platform
import socket
import sys
import time
import urllib.parse
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import attrs
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ragent_memory.core.logs import get_logger
from ragent_memory.engine.tools import call_tool
from ragent_memory.errors import ConfigError, InvalidMessagesError
from ragent_memory.recall.refs import RECALL_TOOL_NAME
from ragent_memory.serve import sse
from ragent_memory.serve.bodies import BodyCache, BodyEncoder, BodyError
from ragent_memory.serve.upstream import Client, Reply, UpstreamBroke, lean_target
from ragent_memory.settings import ServeSettings, Settings

if TYPE_CHECKING:
    from ragent_memory.engine.memory_engine import MemoryEngine, PreparedContext, TurnReport

log = get_logger(__name__)

Message = dict[str, Any]
_T = TypeVar("_T")
_WORKERS = 40  # threads for prepare and tool answers: as many as Starlette's pool had

# Hop-by-hop and proxy-own request headers; everything else the caller sent reaches the
# upstream (Authorization, OpenAI-Organization, api-key, …).
_REQUEST_DROP = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
        "accept-encoding",  # the proxy reads the body, so it negotiates its own encoding
        "expect",  # the proxy has the whole body before it asks the upstream
        "x-session-id",
        "x-user-id",
    }
)
_RESPONSE_DROP = frozenset(
    {
        b"content-length",
        b"content-encoding",  # bodies are relayed decoded
        b"transfer-encoding",
        b"connection",
        b"keep-alive",
        b"date",
        b"server",
    }
)
NO_SESSION = (
    "no session id: send the X-Session-Id header (or set the request's user field) "
    "so the proxy knows which conversation this is"
)


class _Gone(Exception):
    """The client went away before its request body had arrived."""


class _Reject(Exception):
    """A request the proxy answers itself with an error status and one line."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        self.status = status
        self.message = message
        self.kind = kind
        super().__init__(message)


@attrs.frozen
class _Out:
    """A whole response: sent as two ASGI messages on the hot route, or as a Starlette
    ``Response`` on the others (the same status, headers and bytes)."""

    status: int
    headers: list[tuple[bytes, bytes]]  # as they go out: lower-case names
    body: bytes

    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        """As Starlette writes them: lower-case names, then the body's length."""
        if self.status < 200 or self.status in (204, 304):
            return self.headers
        return [*self.headers, (b"content-length", b"%d" % len(self.body))]

    async def send(self, send: Send) -> None:
        start = {"type": "http.response.start", "status": self.status}
        await send({**start, "headers": self.raw_headers()})
        await send({"type": "http.response.body", "body": self.body, "more_body": False})

    def response(self) -> Response:
        response = Response(self.body, status_code=self.status)
        response.raw_headers = self.raw_headers()
        return response


def error_response(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    headers: Mapping[str, str] | None = None,
) -> _Out:
    """An OpenAI-shaped error on one line: the openai client shows ``message``."""
    body = {"error": {"message": message, "type": kind, "code": status}}
    text = json.dumps(body, ensure_ascii=False) + "\n"
    raw = [(b"content-type", b"application/json"), *_raw(headers or {})]
    return _Out(status, raw, text.encode())


@functools.cache
def _header_name(field: str) -> str:
    return "X-Ragent-" + "-".join(part.capitalize() for part in field.split("_"))


_REPORT_NAMES: dict[type, tuple[tuple[str, str, bytes], ...]] = {}


def _report_names(kind: type[TurnReport]) -> tuple[tuple[str, str, bytes], ...]:
    """Per ``TurnReport`` field: its name, its header, the header as it goes out."""
    names = _REPORT_NAMES.get(kind)
    if names is None:
        fields = (field.name for field in attrs.fields(kind))
        names = tuple(
            (name, _header_name(name), _header_name(name).lower().encode()) for name in fields
        )
        _REPORT_NAMES[kind] = names
    return names


def _report_values(report: TurnReport, rounds: int) -> Iterator[tuple[str, bytes, str]]:
    """``(header, header as it goes out, value)`` for every figure the report has, plus the
    tool rounds the proxy answered itself."""
    for name, header, raw in _report_names(type(report)):
        value = getattr(report, name)
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, float):
            text = f"{value:.3f}"
        else:
            text = str(value)
        yield header, raw, text
    yield "X-Ragent-Tool-Rounds", b"x-ragent-tool-rounds", str(rounds)


def report_headers(report: TurnReport, rounds: int) -> dict[str, str]:
    """Every figure of the ``TurnReport`` as an ``X-Ragent-*`` header (``chars_in`` →
    ``X-Ragent-Chars-In``; booleans as ``true``/``false``), plus the tool rounds the proxy
    answered itself."""
    return {header: text for header, _, text in _report_values(report, rounds)}


def _report_raw(report: TurnReport, rounds: int) -> list[tuple[bytes, bytes]]:
    """``report_headers`` as they go out (built on every request, so without dicts)."""
    return [(raw, text.encode("latin-1")) for _, raw, text in _report_values(report, rounds)]


def identify(headers: Mapping[str, str], body: Mapping[str, Any]) -> tuple[str, str | None]:
    """``(session_id, user_id)`` of a request: headers first, then the ``user`` field."""
    user_field = body.get("user") if isinstance(body.get("user"), str) else None
    session_id = headers.get("x-session-id") or user_field
    if not session_id:
        raise _Reject(400, NO_SESSION)
    return session_id, headers.get("x-user-id") or user_field


def _declared_tools(body: Mapping[str, Any]) -> set[str]:
    names = set()
    for tool in body.get("tools") or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.add(function["name"])
    return names


def _split_calls(
    message: Mapping[str, Any], own: Mapping[str, Any]
) -> tuple[list[Message], list[Message]]:
    """The message's tool calls: (the proxy's own, the app's)."""
    mine: list[Message] = []
    theirs: list[Message] = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        (mine if name in own else theirs).append(call)
    return mine, theirs


def _strip_own_calls(data: dict[str, Any], own: Mapping[str, Any]) -> bool:
    """Remove the proxy-tool calls from every choice of a completion; True if any was."""
    stripped = False
    for choice in data.get("choices") or ():
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            continue
        mine, theirs = _split_calls(message, own)
        if not mine:
            continue
        stripped = True
        if theirs:
            message["tool_calls"] = theirs
        else:
            message.pop("tool_calls", None)
            if message.get("content") is None:
                message["content"] = ""
            if choice.get("finish_reason") == "tool_calls":
                choice["finish_reason"] = "stop"
    return stripped


def _first_message(data: Any) -> Message | None:
    """The assistant message of choice 0 (the one the app keeps, as SDKs do)."""
    choices = data.get("choices") if isinstance(data, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    return message if isinstance(message, dict) else None


def _only_message(data: Any) -> Message | None:
    """The assistant message of a one-choice completion."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict):
        message = choices[0].get("message")
        if isinstance(message, dict):
            return message
    return None


class _Histories:
    """The last history handed to the engine per session (a bounded LRU).

    Every request carries the whole history as fresh JSON, so every message is a new dict and
    the engine would re-digest all of them. Messages equal to the ones at the same position
    last time are swapped for those earlier objects (a C-level ``==`` per message), so the
    engine's identity check recognises them and ``prepare`` only works on what is new.
    """

    def __init__(self, max_sessions: int = 256) -> None:
        self._last: collections.OrderedDict[str, list[Message]] = collections.OrderedDict()
        self._max = max_sessions

    def adopt(self, session_id: str, messages: list[Any], start: int = 0) -> None:
        """Swap equal messages of ``messages`` (a list the proxy owns) for earlier objects,
        from ``start`` on (the body cache hands back the objects adopted before it)."""
        last = self._last.get(session_id)
        if last is None:
            return
        differ = map(operator.is_not, messages[start:], last[start:])  # at C speed
        for index in list(itertools.compress(itertools.count(start), differ)):
            if messages[index] == last[index]:
                messages[index] = last[index]

    def remember(self, session_id: str, messages: list[Message]) -> None:
        self._last[session_id] = messages
        self._last.move_to_end(session_id)
        while len(self._last) > self._max:
            self._last.popitem(last=False)


@attrs.define
class _Turn:
    """One chat-completions request on its way through the proxy."""

    body: dict[str, Any]
    history: list[Message]
    session_id: str
    user_id: str | None
    headers: list[tuple[str, str]]
    report: TurnReport
    messages: list[Message]  # what the upstream gets: the prepared view (+ tool rounds)
    own: dict[str, dict[str, Any]]  # the proxy's tools offered in this turn, name → schema
    started: float  # perf_counter() when the request arrived
    on_loop: bool  # prepare ran on the event loop (it could not wait), not in a worker
    rounds: int = 0
    upstream_s: float = 0.0  # time spent waiting for the upstream

    def overhead_ms(self) -> float:
        """What the proxy itself added so far: time since arrival, upstream waits excluded."""
        return (time.perf_counter() - self.started - self.upstream_s) * 1000

    def payload(self, encoder: BodyEncoder, *, with_tools: bool) -> bytes:
        """The body for the upstream: the app's, with the prepared messages (and tools)."""
        body = {**self.body, "messages": self.messages}
        if with_tools and self.own:
            body["tools"] = [*(self.body.get("tools") or ()), *self.own.values()]
        return encoder.encode(self.session_id, body)


class Proxy:
    """The proxy's state: one engine, one upstream client, the bounds. See the module doc."""

    def __init__(
        self,
        engine: MemoryEngine,
        settings: ServeSettings,
    ) -> None:
        if not settings.upstream:
            raise ConfigError("serve.upstream", "required: the upstream base URL")
        self.engine = engine
        self.settings = settings
        self.upstream = settings.upstream.rstrip("/")
        self._client: aiohttp.ClientSession | None = None
        self._lean: Client | None = None  # plain-http upstreams' non-streamed completions
        self._in_flight = 0
        self._histories = _Histories()
        self._bodies = BodyCache()
        self._encoder = BodyEncoder()  # the prepared bodies: only what is new is encoded
        # prepare runs on the event loop itself when it provably never waits (the engine's
        # prepare_may_wait: compaction_timeout_s 0, or a turn that cannot bring the view to
        # the compaction trigger) and the store is local. Otherwise it may wait on a
        # compaction for up to compaction_timeout_s, the offline summarizer's too (seconds of
        # CPU on a large view): on the loop that would stall every other client's request and
        # stream meanwhile, so it pays a worker thread hop (~0.4 ms a request).
        self._local = engine.settings.store.url is None
        # sessions with a prepare in a worker thread: their next prepare goes there too, as
        # it would wait on the session's lock (held by a prepare that may wait)
        self._waiting: collections.Counter[str] = collections.Counter()
        # after_turn in order, off the request path; one thread is plenty (it writes rows).
        self._after = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragent-after-turn")
        # prepare (when it may wait) and the proxy's tool answers: a plain executor hop
        # costs ~30-50 µs less than Starlette's (anyio) thread pool
        self._workers = ThreadPoolExecutor(
            max_workers=min(self.settings.max_concurrency, _WORKERS),
            thread_name_prefix="ragent-serve",
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        # aiohttp, not httpx: ~0.2 ms a request instead of ~1 ms (benchmarks/proxy.py).
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=min(10.0, self.settings.timeout_s),
            sock_read=self.settings.timeout_s,
        )
        target = lean_target(self.upstream)
        if target is not None:  # the non-streamed completions: see ``upstream``
            self._lean = Client(
                *target,
                limit=self.settings.max_concurrency,
                connect_s=min(10.0, self.settings.timeout_s),
                read_s=self.settings.timeout_s,
            )
        connector = aiohttp.TCPConnector(limit=self.settings.max_concurrency)
        self._client = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            trust_env=False,
            # the upstream's cookies go to the caller they were set for, never to the next one
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("Content-Type", "User-Agent"),  # the caller's, as sent
        )

    async def stop(self) -> None:
        if self._lean is not None:
            self._lean.close()
        if self._client is not None:
            await self._client.close()
        await asyncio.to_thread(self._after.shutdown, wait=True)
        await asyncio.to_thread(self._workers.shutdown, wait=True)
        await asyncio.to_thread(self.engine.flush)

    @property
    def client(self) -> aiohttp.ClientSession:
        if self._client is None:
            raise RuntimeError("the proxy is not started")
        return self._client

    # ------------------------------------------------------------------ routes

    async def healthz(self, request: Request) -> Response:
        return Response(b'{"status":"ok"}\n', media_type="application/json")

    async def models(self, request: Request) -> Response:
        """``GET /v1/models`` (and ``/v1/models/{id}``) passed through."""
        path = request.url.path.removeprefix("/v1")
        try:
            async with self.client.get(
                self.upstream + path, headers=_forward_headers(request.headers.raw)
            ) as response:
                upstream = await _read_whole(response)
        except TimeoutError:
            return error_response(504, "upstream timed out", "upstream_error").response()
        except aiohttp.ClientError as err:
            return error_response(
                502, f"upstream unreachable: {type(err).__name__}", "upstream_error"
            ).response()
        return _relay(upstream).response()

    async def chat_completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/chat/completions`` as a plain ASGI callable: it runs on every agent
        turn, so no request/response objects or middleware stand between uvicorn and it."""
        started = time.perf_counter()
        if self._in_flight >= self.settings.max_concurrency:
            busy = f"busy: {self._in_flight} requests in flight (serve.max_concurrency); retry"
            await error_response(503, busy, "server_busy", {"Retry-After": "1"}).send(send)
            return
        self._in_flight += 1
        release = True
        try:
            try:
                turn = await self._turn(scope, receive, started)
                if turn.body.get("stream") is not True:
                    out, reply = await self._complete(turn)
                else:
                    relay = await self._stream(turn)
                    if isinstance(relay, _Relay):
                        release = False  # the relay releases when done
                        await relay(send)
                        return
                    out, reply = relay, None  # the upstream's error
            except _Reject as err:
                await error_response(err.status, err.message, err.kind).send(send)
                return
            except _Gone:
                return
            try:
                await out.send(send)
            finally:  # after the response: after_turn's thread must not hold the GIL up
                self._done(turn, reply, out.status)
        finally:
            if release:
                self._in_flight -= 1

    def routes(self) -> list[Route]:
        """The routes other than the hot one (``create_app`` sends that one past Starlette);
        the chat route is here too, for what the fast dispatch leaves to Starlette."""
        return [
            Route("/v1/chat/completions", _Endpoint(self.chat_completions), methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model:path}", self.models, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
        ]

    # ------------------------------------------------------------------ a turn

    async def _turn(self, scope: Scope, receive: Receive, started: float) -> _Turn:
        raw_headers = scope["headers"]
        headers = _headers(raw_headers, (b"x-session-id", b"x-user-id", b"content-length"))
        raw = await self._read(receive, headers.get("content-length"))
        key = headers.get("x-session-id")  # the ``user`` field is known after parsing
        try:
            body, reused = self._bodies.read(key, raw)
        except BodyError as err:
            raise _Reject(400, str(err)) from err
        session_id, user_id = identify(headers, body)
        history = body["messages"]
        self._histories.adopt(session_id, history, reused)
        self._bodies.adopt(key, history)
        try:
            on_loop = not self._may_wait(history, session_id)
            if on_loop:
                prepared = self.engine.prepare(history, session_id=session_id, user_id=user_id)
            else:
                prepared = await self._prepare_in_worker(history, session_id, user_id)
        except InvalidMessagesError as err:
            raise _Reject(400, str(err)) from err
        return _Turn(
            body=body,
            history=history,
            session_id=session_id,
            user_id=user_id,
            headers=_forward_headers(raw_headers),
            report=prepared.report,
            messages=list(prepared.messages),
            own=self._offer(body, prepared.report, user_id),
            started=started,
            on_loop=on_loop,
        )

    async def _read(self, receive: Receive, declared: str | None) -> bytes:
        """The request body, joined once; a 413 past ``serve.max_body_bytes``."""
        limit = self.settings.max_body_bytes
        too_big = f"request body over {limit} bytes (serve.max_body_bytes)"
        if declared and declared.isdigit() and int(declared) > limit:
            raise _Reject(413, too_big)
        parts = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise _Gone  # the client went away
            part = message.get("body", b"")
            size += len(part)
            if size > limit:
                raise _Reject(413, too_big)
            parts.append(part)
            if not message.get("more_body", False):
                return parts[0] if len(parts) == 1 else b"".join(parts)

    def _may_wait(self, history: list[Message], session_id: str) -> bool:
        """Whether this turn's ``prepare`` must leave the event loop (see ``__init__``)."""
        if not self._local or session_id in self._waiting:
            return True
        return self.engine.prepare_may_wait(history, session_id=session_id)

    async def _prepare_in_worker(
        self, history: list[Message], session_id: str, user_id: str | None
    ) -> PreparedContext:
        """``prepare`` in a worker thread; the session counts as waiting until the thread is
        done with it, even when this request is cancelled meanwhile (the thread goes on)."""
        loop = asyncio.get_running_loop()
        call = functools.partial(
            self.engine.prepare, history, session_id=session_id, user_id=user_id
        )
        future = self._workers.submit(call)
        self._waiting[session_id] += 1

        def release() -> None:
            self._waiting[session_id] -= 1
            if not self._waiting[session_id]:
                del self._waiting[session_id]

        def done(_: object) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nothing waits any more
                loop.call_soon_threadsafe(release)

        future.add_done_callback(done)
        return await asyncio.wrap_future(future)

    def _offer(
        self, body: Mapping[str, Any], report: TurnReport, user_id: str | None
    ) -> dict[str, dict[str, Any]]:
        """The proxy's own tools for this request: the recall tool when the view shows a
        placeholder, preview or recalled excerpt to read back; the search tool when there is
        earlier conversation the view no longer shows (a summary, dropped turns, or the user's
        other sessions). None when the app pins ``tool_choice`` or uses the legacy
        ``functions``, and never one the app declares itself."""
        choice = body.get("tool_choice")
        if choice == "none" or isinstance(choice, dict) or "functions" in body:
            return {}
        own: dict[str, dict[str, Any]] = {}
        if report.trimmed or report.truncated or report.recalled:  # the view names refs
            own[RECALL_TOOL_NAME] = self.engine.recall_tool()
        earlier = report.generation or report.dropped_turns or user_id is not None
        if self.engine.settings.recall_enabled and earlier:
            search = self.engine.search_tool()
            own[search["function"]["name"]] = search
        for name in _declared_tools(body) & own.keys():
            del own[name]
        return own

    async def _in_worker(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
        call = functools.partial(fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._workers, call)

    def _answer(self, turn: _Turn, calls: Sequence[Message]) -> list[Message]:
        """The tool messages answering the proxy's own calls (run in a worker thread): the
        arguments are the model's, so ``call_tool`` refuses bad ones with a line it can read."""
        return [
            {
                "role": "tool",
                "tool_call_id": call.get("id"),
                "content": call_tool(
                    self.engine,
                    call["function"].get("name"),
                    call["function"].get("arguments"),
                    session_id=turn.session_id,
                    user_id=turn.user_id,
                ),
            }
            for call in calls
        ]

    async def _continue(self, turn: _Turn, assistant: Message, calls: Sequence[Message]) -> None:
        """Answer the proxy's own calls and add the round to what the upstream sees next."""
        answers = await self._in_worker(self._answer, turn, calls)
        turn.messages += [assistant, *answers]
        turn.rounds += 1

    def _done(self, turn: _Turn, reply: Message | None, status: int) -> None:
        """Log the request; hand history + reply to ``after_turn`` off the request path."""
        log.info(
            "serve.request",
            session_id=turn.session_id,
            status=status,
            chars_in=turn.report.chars_in,
            chars_out=turn.report.chars_out,
            generation=turn.report.generation,
            tool_rounds=turn.rounds,
            prepare_on_loop=turn.on_loop,
            duration_ms=round((time.perf_counter() - turn.started) * 1000, 3),
            proxy_ms=round(turn.overhead_ms(), 3),
        )
        if reply is None:
            return
        history = [*turn.history, reply]
        self._histories.remember(turn.session_id, history)
        try:
            self._after.submit(self._after_turn, history, turn.session_id, turn.user_id)
        except RuntimeError:  # shutting down: the next request records these messages
            log.warning("serve.after_turn_skipped", session_id=turn.session_id)

    def _after_turn(self, history: list[Message], session_id: str, user_id: str | None) -> None:
        try:
            self.engine.after_turn(history, session_id=session_id, user_id=user_id)
        except Exception as err:  # the worker boundary: a bad reply must not stop the proxy
            log.error("serve.after_turn_failed", session_id=session_id, error=repr(err))

    # ------------------------------------------------------------------ upstream

    async def _open(self, turn: _Turn, *, with_tools: bool) -> aiohttp.ClientResponse:
        """The upstream's response to this round, its headers read (the caller closes it)."""
        payload = turn.payload(self._encoder, with_tools=with_tools)
        sent = time.perf_counter()
        try:
            return await self.client.post(
                self.upstream + "/chat/completions", data=payload, headers=turn.headers
            )
        except TimeoutError as err:
            raise self._timed_out() from err
        except aiohttp.ClientError as err:
            raise _Reject(
                502, f"upstream unreachable: {type(err).__name__}", "upstream_error"
            ) from err
        finally:
            turn.upstream_s += time.perf_counter() - sent

    async def _send(self, turn: _Turn, *, with_tools: bool) -> Reply:
        """The upstream's whole response to this round."""
        if self._lean is None:
            response = await self._open(turn, with_tools=with_tools)
            sent = time.perf_counter()
            try:
                return await _read_whole(response)
            except TimeoutError as err:
                raise self._timed_out() from err
            except aiohttp.ClientError as err:
                raise _broke(err) from err
            finally:
                response.release()  # back to the pool when read whole; closed otherwise
                turn.upstream_s += time.perf_counter() - sent
        payload = turn.payload(self._encoder, with_tools=with_tools)
        sent = time.perf_counter()
        try:
            return await self._lean.post("/chat/completions", payload, turn.headers)
        except TimeoutError as err:
            raise self._timed_out() from err
        except UpstreamBroke as err:
            raise _broke(err) from err
        except OSError as err:
            raise _Reject(
                502, f"upstream unreachable: {type(err).__name__}", "upstream_error"
            ) from err
        finally:
            turn.upstream_s += time.perf_counter() - sent

    def _timed_out(self) -> _Reject:
        return _Reject(
            504, f"upstream timed out after {self.settings.timeout_s:g} s", "upstream_error"
        )

    async def _complete(self, turn: _Turn) -> tuple[_Out, Message | None]:
        """A non-streamed completion, with the proxy's own tool rounds inside, and the reply
        to record (None when there is none)."""
        last_round = self.settings.max_tool_rounds
        while True:
            upstream = await self._send(turn, with_tools=turn.rounds < last_round)
            data = _json_or_none(upstream.content) if upstream.status_code == 200 else None
            message = _only_message(data)
            if message is None:  # an error, n > 1 choices or an odd reply: no tool rounds
                if not isinstance(data, dict):
                    return _relay(upstream, _report_raw(turn.report, turn.rounds)), None
                break
            mine, theirs = _split_calls(message, turn.own)
            if not mine or theirs or turn.rounds >= last_round:
                break
            await self._continue(turn, message, mine)
        content = upstream.content
        if isinstance(data, dict) and _strip_own_calls(data, turn.own):
            content = orjson.dumps(data)
        headers = _report_raw(turn.report, turn.rounds)
        headers.append((b"x-ragent-proxy-ms", b"%.3f" % turn.overhead_ms()))
        return _relay(upstream, headers, content=content), _first_message(data)

    async def _stream(self, turn: _Turn) -> _Out | _Relay:
        """A streamed completion: see the module doc for how the proxy's tools are handled."""
        last_round = self.settings.max_tool_rounds
        while True:
            upstream = await self._open(turn, with_tools=turn.rounds < last_round)
            if upstream.status != 200:
                try:
                    failed = await _read_whole(upstream)
                except (TimeoutError, aiohttp.ClientError) as err:
                    raise _broke(err) from err
                finally:
                    upstream.release()
                return _relay(failed, _report_raw(turn.report, turn.rounds))
            reader = _StreamReader(upstream, turn.own)
            try:
                if await reader.decide() == "own" and turn.rounds < last_round:
                    assistant = await reader.drain()
                    mine, theirs = _split_calls(assistant, turn.own)
                    if mine and not theirs and not assistant.get("content"):
                        await reader.close()
                        await self._continue(turn, assistant, mine)
                        continue
            except (TimeoutError, aiohttp.ClientError) as err:
                await reader.close()
                raise _Reject(
                    502, f"upstream stream broke: {type(err).__name__}", "upstream_error"
                ) from err
            break
        headers = _response_headers(upstream.raw_headers, _report_raw(turn.report, turn.rounds))

        def finish(reply: Message | None) -> None:
            self._in_flight -= 1
            self._done(turn, reply, 200)

        return _Relay(reader, headers, finish)


# ---------------------------------------------------------------------- streaming


class _StreamReader:
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
        self._own_indices: set[int] = set()  # tool-call indices of proxy-tool calls
        self._app_calls = False

    async def _next(self) -> bytes | None:
        """The next complete event, None at the end of the stream."""
        while not self._pending:
            if self._ended:
                return None
            try:
                data = await anext(self._chunks)
            except StopAsyncIteration:
                self._ended = True
                rest = self._splitter.rest()
                if rest:
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
            verdict = _verdict(chunk, self.own) if chunk is not None else None
            if verdict is not None:
                return verdict
        return "pass"

    async def drain(self) -> Message:
        """Read the rest of a reply that started with a proxy-tool call; the message it spells."""
        while (event := await self._next()) is not None:
            self._held.append(event)
        builder = sse.ReplyBuilder()
        for event in self._held:
            chunk = sse.chunk_of(event)
            if chunk is not None:
                builder.add(chunk)
        return builder.message()

    async def forward(self) -> AsyncIterator[bytes]:
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
        cut = bool(self.own) and self._cut(chunk)
        self.reply.add(chunk)
        if not cut:
            return event
        return sse.encode(chunk) if _has_substance(chunk) else b""

    def _cut(self, chunk: dict[str, Any]) -> bool:
        """Remove the deltas of proxy-tool calls from ``chunk`` in place; True if it changed."""
        changed = False
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                kept = [call for call in calls if not self._is_own(call)]
                if len(kept) != len(calls):
                    changed = True
                    if kept:
                        delta["tool_calls"] = kept
                    else:
                        del delta["tool_calls"]
            if (
                self._own_indices
                and not self._app_calls
                and choice.get("finish_reason") == "tool_calls"
            ):
                choice["finish_reason"] = "stop"  # every call of this reply was cut
                changed = True
        return changed

    def _is_own(self, call: Any) -> bool:
        if not isinstance(call, dict) or not isinstance(call.get("index"), int):
            return False
        function = call.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if name in self.own:
            self._own_indices.add(call["index"])
        elif name:
            self._app_calls = True
        return call["index"] in self._own_indices

    async def close(self) -> None:
        self.upstream.release()  # back to the pool when read whole; closed otherwise


def _verdict(chunk: dict[str, Any], own: Mapping[str, Any]) -> str | None:
    for delta in sse.deltas(chunk):
        for call in delta.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            if name:
                return "own" if name in own else "pass"
        for key, value in delta.items():
            if key not in ("role", "tool_calls") and value not in (None, "", [], {}):
                return "pass"  # text, a refusal, reasoning: the app's reply has begun
    return None


def _has_substance(chunk: Mapping[str, Any]) -> bool:
    if chunk.get("usage"):
        return True
    for choice in chunk.get("choices") or ():
        if isinstance(choice, dict) and (choice.get("finish_reason") or choice.get("delta")):
            return True
    return False


class _Relay:
    """Streams the reader's events to the client as they come (no Content-Length);
    ``finish`` runs exactly once, with the reply the client received (None when the stream
    broke or the client left)."""

    def __init__(
        self,
        reader: _StreamReader,
        headers: list[tuple[bytes, bytes]],
        finish: Callable[[Message | None], None],
    ) -> None:
        self.headers = headers
        self.reader = reader
        self.finish = finish

    async def __call__(self, send: Send) -> None:
        reply: Message | None = None
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            try:
                async for event in self.reader.forward():
                    await send({"type": "http.response.body", "body": event, "more_body": True})
            except (TimeoutError, aiohttp.ClientError) as err:
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
            await self.reader.close()
            self.finish(reply)


# ---------------------------------------------------------------------- helpers


def _forward_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    headers = ((name.decode("latin-1"), value) for name, value in raw)
    return [
        (name, value.decode("latin-1"))
        for name, value in headers
        if name.lower() not in _REQUEST_DROP
    ]


def _headers(raw: Iterable[tuple[bytes, bytes]], names: Iterable[bytes]) -> dict[str, str]:
    """The first value of each of ``names`` (lower case) the request has."""
    wanted = set(names)
    found: dict[str, str] = {}
    for name, value in raw:
        key = name.lower()
        if key in wanted:
            found.setdefault(key.decode("latin-1"), value.decode("latin-1"))
    return found


def _raw(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


def _response_headers(
    items: Iterable[tuple[bytes, bytes]], ours: Sequence[tuple[bytes, bytes]] = ()
) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers to relay (every one, repeated ones included, but
    hop-by-hop ones and any the proxy sets itself), then the proxy's ``ours``."""
    dropped = _RESPONSE_DROP.union(name for name, _ in ours) if ours else _RESPONSE_DROP
    kept = [(name.lower(), value) for name, value in items]
    return [*((name, value) for name, value in kept if name not in dropped), *ours]


async def _read_whole(response: aiohttp.ClientResponse) -> Reply:
    """A whole aiohttp response, as the lean client gives one."""
    content = await response.read()
    return Reply(response.status, list(response.raw_headers), content)


def _broke(err: Exception) -> _Reject:
    return _Reject(502, f"upstream reply broke: {type(err).__name__}", "upstream_error")


def _json_or_none(content: bytes) -> Any:
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return None


def _relay(
    upstream: Reply,
    ours: Sequence[tuple[bytes, bytes]] = (),
    *,
    content: bytes | None = None,
) -> _Out:
    headers = _response_headers(upstream.headers, ours)
    return _Out(upstream.status_code, headers, upstream.content if content is None else content)


# ---------------------------------------------------------------------- app and server


class _Endpoint:
    """A plain ASGI callable as a Starlette route's endpoint (a bound method would be
    wrapped in a request/response adapter)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


class App:
    """The ASGI app: ``POST /v1/chat/completions`` goes straight to the proxy, everything
    else (the other routes, lifespan, 404/405) through Starlette."""

    def __init__(self, proxy: Proxy, router: Starlette) -> None:
        self.proxy = proxy
        self.router = router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] == "/v1/chat/completions"
            and scope["method"] == "POST"
        ):
            await self.proxy.chat_completions(scope, receive, send)
        else:
            await self.router(scope, receive, send)


def create_app(
    settings: Settings,
    *,
    engine: MemoryEngine | None = None,
) -> App:
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

    return App(proxy, Starlette(routes=proxy.routes(), lifespan=lifespan))


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free port), so the server is reachable once this
    returns and the chosen port can be told."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # asyncio: NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 128 << 20) -> bool:
    """Ask glibc to keep freed memory for reuse instead of handing it back to the kernel;
    True when it agreed. Every request allocates its body (up to a few MB) and copies of
    it, then frees them; by default glibc maps such blocks fresh and unmaps them on free, so
    the next request faults every page in again (~0.2 ms a request on a VM). Kept, the
    process holds about its peak (at most ``trim_threshold`` more). Only ``serve`` calls
    this: a library must not change its host's allocator."""
    if platform.libc_ver()[0] != "glibc":
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    mallopt = ctypes.CDLL(name).mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mmap = mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
    return bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold) and mmap)


LOOP_SWITCH_S = 0.0005  # the GIL switch interval while serving (CPython's default: 5 ms)


def favour_the_event_loop(interval_s: float = LOOP_SWITCH_S) -> float:
    """Make a thread that holds the GIL hand it over after ``interval_s`` instead of 5 ms;
    the interval it replaces. Every request runs on the event loop thread, while
    ``after_turn``, compactions and the recall indexer run in threads of their own: when the
    loop lets go of the GIL (a SQLite read in ``prepare``, a socket call), such a thread takes
    it and, at the default, may keep it for 5 ms while the request waits. CPU-bound threads
    switch more often in exchange (a few µs a switch). Only ``serve`` calls this: a library
    must not change its host's interpreter."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(interval_s)
    return previous


def whole_bodies(limit: int) -> type[asyncio.Protocol] | None:
    """uvicorn's httptools protocol, handing the app each request body whole (up to
    ``limit`` bytes); None without httptools (uvicorn then picks its own).

    uvicorn copies each piece of a body into a buffer, pauses reading past 64 KB and wakes
    the app, which copies the buffer out and asks for more: a 2 MB history costs ~30 such
    rounds and three copies of it before the proxy has it. Here the pieces are kept as they
    come and joined once when the body is complete, so the app gets it in one message. Past
    ``limit`` (``serve.max_body_bytes``) what came so far goes to uvicorn's own flow control,
    so the app still sees the body is too big and refuses it, and at most ``limit`` bytes are
    held per request."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    class WholeBodies(HttpToolsProtocol):
        _parts: list[bytes]
        _size = -1  # bytes kept so far; -1: this body goes through uvicorn's flow control

        def on_headers_complete(self) -> None:
            self._parts, self._size = [], 0
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if self._size < 0 or self.parser.should_upgrade():
                super().on_body(body)
            elif not self.cycle.response_complete:  # answered already: the rest is dropped
                self._parts.append(body)
                self._size += len(body)
                if self._size > limit:
                    parts, self._parts, self._size = self._parts, [], -1
                    super().on_body(b"".join(parts))

        def on_message_complete(self) -> None:
            parts, self._parts, self._size = self._parts, [], -1
            if parts and not self.cycle.response_complete:
                self.cycle.body = parts[0] if len(parts) == 1 else b"".join(parts)  # type: ignore[assignment]
            super().on_message_complete()

    return WholeBodies


def serve(
    settings: Settings,
    *,
    verbose: bool = False,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Run the proxy under uvicorn until SIGINT/SIGTERM; ``ready`` gets the base URL once the
    socket listens."""
    import uvicorn

    keep_freed_memory()
    favour_the_event_loop()
    config = settings.serve
    sock = bind(config.host, config.port)
    host, port = sock.getsockname()[:2]
    app = create_app(settings)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="info" if verbose else "warning",
            access_log=verbose,
            timeout_graceful_shutdown=30,
            h11_max_incomplete_event_size=64 * 1024,
            proxy_headers=False,  # the client's address is never used: no per-request rewrite
            http=whole_bodies(config.max_body_bytes) or "auto",
        )
    )
    if ready is not None:
        shown = f"[{host}]" if ":" in host else host
        ready(f"http://{shown}:{port}/v1")
    with contextlib.closing(sock):
        server.run(sockets=[sock])


def shown_url(url: str) -> str:
    """``url`` without any user:password part, for logs and the ready line."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
