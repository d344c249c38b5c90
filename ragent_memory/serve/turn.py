"""One turn through the proxy, whatever its wire format (``wire``): ``prepare`` the app's
history, forward the view to the upstream, answer the calls of the proxy's own tools there and
ask again (for a stream, see ``stream``), hand the reply to the app, then ``after_turn`` off
the request path.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import time
from collections.abc import Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import attrs
import orjson
from starlette.responses import Response

from ragent_memory.core import tracing
from ragent_memory.core.chars import Message, chars, total_chars
from ragent_memory.core.logs import get_logger
from ragent_memory.errors import ConfigError, InvalidMessagesError
from ragent_memory.recall.refs import RECALL_TOOL_NAME
from ragent_memory.serve import chat
from ragent_memory.serve.bodies import BodyCache, KeptTranslations
from ragent_memory.serve.http import Reject, response_headers, whole_response
from ragent_memory.serve.identity import Identity
from ragent_memory.serve.own_tools import answer_calls, without_calls
from ragent_memory.serve.splice import Splices
from ragent_memory.serve.stream import Relay, RoundFailed, StreamReader
from ragent_memory.serve.upstream import STREAM_ERRORS, Reply, Upstream
from ragent_memory.serve.wire import Translations, Wire
from ragent_memory.settings import ServeSettings

if TYPE_CHECKING:
    from ragent_memory.engine.memory_engine import MemoryEngine, PreparedContext, TurnReport

log = get_logger(__name__)

_WORKERS = 40  # threads for prepare and tool answers: as many as Starlette's pool had


@attrs.frozen
class Origin:
    """Where a request's body came from: its session's key (``BodyCache`` and ``KeptTranslations``), its
    size in bytes and its query string (passed on to the upstream)."""

    key: Hashable = None
    size: int = 0
    query: str = ""


@attrs.define
class Turn:
    """One request on its way through the proxy."""

    wire: Wire
    base: str | None  # the upstream base URL of the wire's provider
    path: str  # the wire's upstream path and the request's query (Claude Code's ?beta=true)
    body: dict[str, Any]
    history: list[Message]  # the request's conversation as the engine's messages
    session_id: str
    user_id: str | None
    headers: list[tuple[str, str]]  # the caller's, as the upstream gets them
    report: TurnReport
    messages: list[Message]  # what the upstream gets: the prepared view (+ tool rounds)
    own: dict[str, dict[str, Any]]  # the proxy's tools offered in this turn, name → schema
    started: float  # perf_counter() when the request arrived
    on_loop: bool  # prepare ran on the event loop (it could not wait), not in a worker
    translations: Translations  # the session's last request's translations, and this one's
    budget: int  # B: the continued upstream requests stay within it
    client_len: int  # how many engine messages the app's own history made (before splices)
    start: int  # where the proxy's own rounds begin in ``messages`` (the prepared view's end)
    rounds: int = 0
    upstream_s: float = 0.0  # time spent waiting for the upstream
    final: Message | None = None  # the model's last reply, as it stays (own calls answered or cut)
    answered_last: bool = False  # the last reply's own calls were answered beside the app's

    def seen(self, reply: Message) -> list[Message]:
        """What the model said and was answered in this turn, in order: the proxy's rounds
        and its last reply (``reply``, the one the app got, when the model's is not known;
        nothing more when the last round is the proxy's answers beside the app's calls)."""
        last = [] if self.answered_last else [self.final or reply]
        return [*self.messages[self.start :], *last]

    def reported(self) -> TurnReport:
        """The ``TurnReport`` with ``chars_out`` what the last upstream request carried (the
        proxy's rounds included)."""
        added = total_chars(self.messages[self.start :])
        if not added:
            return self.report
        out = self.report.chars_out + added
        over = self.report.over_budget or out > self.budget
        return attrs.evolve(self.report, chars_out=out, over_budget=over)

    def overhead_ms(self) -> float:
        """What the proxy itself added so far: time since arrival, upstream waits excluded."""
        return (time.perf_counter() - self.started - self.upstream_s) * 1000

    def payload(self, *, with_tools: bool) -> bytes:
        """The body for the upstream: the app's, with the prepared messages (and tools)."""
        tools = list(self.own.values()) if with_tools else []
        return self.wire.payload(self.body, self.messages, tools, self.translations)


class Proxy:
    """The proxy's state: one engine, one upstream client, the worker threads."""

    def __init__(self, engine: MemoryEngine, settings: ServeSettings) -> None:
        if not settings.upstream:
            raise ConfigError("serve.upstream", "required: the upstream base URL")
        self.engine = engine
        self.settings = settings
        self.identity = Identity(settings, engine.store)
        self.bodies = BodyCache()  # keyed by the caller's credential and X-Session-Id
        self.kept_translations = (
            KeptTranslations()
        )  # the same keys: each session's last translation to the engine
        self.splices = Splices()  # what the model saw in place of replies the apps got
        self.in_flight = 0  # requests of every format (serve.max_concurrency)
        self.upstream = Upstream(
            settings.upstream, timeout_s=settings.timeout_s, limit=settings.max_concurrency
        )
        # prepare runs on the loop only when it never waits (see _may_wait) and the store is local
        self._local = engine.settings.store.url is None
        # sessions with a prepare in a worker: their next one goes there too (the session lock)
        self._waiting: collections.Counter[str] = collections.Counter()
        self._after = ThreadPoolExecutor(1, thread_name_prefix="ragent-after-turn")  # in order
        self._workers = ThreadPoolExecutor(
            max_workers=min(settings.max_concurrency, _WORKERS), thread_name_prefix="ragent-serve"
        )

    async def start(self) -> None:
        self.upstream.start()

    async def stop(self) -> None:
        await self.upstream.close()
        await asyncio.to_thread(self._after.shutdown, wait=True)
        await asyncio.to_thread(self._workers.shutdown, wait=True)
        await asyncio.to_thread(self.engine.flush)

    async def turn(
        self,
        wire: Wire,
        body: dict[str, Any],
        headers: Mapping[str, str],
        forward: list[tuple[str, str]],
        started: float,
        origin: Origin | None = None,
    ) -> Turn:
        """The turn of a parsed request, its session identified and its history prepared
        (translated to the engine's messages reusing ``key``'s last translation)."""
        session_id, user_id = self.identity.identify(headers, body, wire)
        origin = origin or Origin()
        translations = self.kept_translations.take(origin.key)
        try:
            history = wire.history(body, translations)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise Reject(400, f"malformed body: {err!r}") from err
        self.kept_translations.keep(origin.key, translations, origin.size)
        client_len = len(history)
        history = self.splices.apply(session_id, history)
        try:
            with tracing.joined(headers):  # the caller's trace, when it sends a traceparent
                on_loop = not self._may_wait(history, session_id)
                if on_loop:
                    prepared = self.engine.prepare(history, session_id=session_id, user_id=user_id)
                else:
                    prepared = await self._prepare_in_worker(history, session_id, user_id)
        except InvalidMessagesError as err:
            raise Reject(400, str(err)) from err
        return Turn(
            wire=wire,
            base=self.settings.upstream_for(wire.provider),
            path=wire.path + (f"?{origin.query}" if origin.query else ""),
            body=body,
            history=history,
            session_id=session_id,
            user_id=user_id,
            headers=forward,
            report=prepared.report,
            messages=list(prepared.messages),
            own=self._offer(wire, body),
            started=started,
            on_loop=on_loop,
            translations=translations,
            budget=self.engine.settings.context_window_chars,
            client_len=client_len,
            start=len(prepared.messages),
        )

    def _may_wait(self, history: list[Message], session_id: str) -> bool:
        """Whether this turn's ``prepare`` must leave the event loop: it may wait on a
        compaction up to ``compaction_timeout_s``, which would stall every other request."""
        if not self._local or session_id in self._waiting:
            return True
        return self.engine.prepare_may_wait(history, session_id=session_id)

    async def _prepare_in_worker(
        self, history: list[Message], session_id: str, user_id: str | None
    ) -> PreparedContext:
        """``prepare`` in a worker; the session counts as waiting until the thread is done,
        even when this request is cancelled meanwhile."""
        loop = asyncio.get_running_loop()
        prepare = tracing.carried(self.engine.prepare)
        future = self._workers.submit(prepare, history, session_id=session_id, user_id=user_id)
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

    def _offer(self, wire: Wire, body: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """The proxy's own tools, the same on every request of a session (the prompt cache
        keeps its prefix): recall, then search unless recall is off, after the app's tools.
        None when the app pins its tools, and never one the app declares."""
        if wire.pins_tools(body):
            return {}
        own: dict[str, dict[str, Any]] = {RECALL_TOOL_NAME: self.engine.recall_tool()}
        if self.engine.settings.recall_enabled:
            search = self.engine.search_tool()
            own[search["function"]["name"]] = search
        for name in wire.declared_tools(body) & own.keys():
            del own[name]
        return own

    def _answer(self, turn: Turn, assistant: Message, calls: Sequence[Message]) -> list[Message]:
        """The tool messages answering the proxy's own calls (run in a worker thread), inside
        the room left under B in the request that carries them (``own_tools``)."""
        room = turn.budget - total_chars(turn.messages) - chars(assistant)
        return answer_calls(self.engine, calls, room, turn.session_id, turn.user_id)

    async def _continue(self, turn: Turn, assistant: Message, calls: Sequence[Message]) -> None:
        """Answer the proxy's own calls and add the round to what the upstream sees next."""
        loop = asyncio.get_running_loop()
        answers = await loop.run_in_executor(self._workers, self._answer, turn, assistant, calls)
        turn.messages += [assistant, *answers]
        turn.rounds += 1

    async def _settle(self, turn: Turn, message: Message | None) -> bool:
        """After a reply of the model: True when it called only the proxy's tools and they
        are answered now (the upstream is to be asked again). Calls of the proxy's beside
        the app's are answered too (the model sees the answers in the app's next request,
        ``Splices``) and the reply goes to the app; past the last round they are cut."""
        if message is None:
            return False
        mine, theirs = chat.split_calls(message, turn.own)
        if mine and turn.rounds < self.settings.max_tool_rounds:
            await self._continue(turn, message, mine)
            turn.answered_last = bool(theirs)
            return not theirs
        turn.final = without_calls(message, turn.own) if mine else message
        return False

    async def complete(self, turn: Turn) -> tuple[Response, Message | None]:
        """A non-streamed completion (own tool rounds inside) and the reply to record, if any."""
        while True:
            payload = turn.payload(with_tools=turn.rounds < self.settings.max_tool_rounds)
            upstream, waited = await self.upstream.call(
                "POST", turn.path, turn.headers, payload, base=turn.base
            )
            turn.upstream_s += waited
            data = chat.json_or_none(upstream.content) if upstream.status_code == 200 else None
            message = turn.wire.reply(data)
            if message is None and not isinstance(data, dict):  # an error: no tool rounds
                return _relayed(upstream, turn), None
            if not await self._settle(turn, message):  # n > 1 choices or an odd reply: none
                break
        content = upstream.content
        if isinstance(data, dict) and turn.own and turn.wire.strip(data, turn.own):
            content = orjson.dumps(data)
        ms = (b"x-ragent-proxy-ms", b"%.3f" % turn.overhead_ms())
        reply = turn.wire.record(data)
        self._splice(turn, reply)  # before the app can send its next request
        return _relayed(upstream, turn, ms, content=content), reply

    async def stream(self, turn: Turn) -> Response | Relay:
        """A streamed completion: the relay, or the upstream's error (see ``stream``)."""
        last_round = self.settings.max_tool_rounds
        while True:
            upstream = await self._open(turn)
            if upstream.status != 200:
                return _relayed(await self.upstream.read(upstream), turn)
            follow = functools.partial(self._next, turn)
            reader = StreamReader(upstream, turn.own, turn.wire, follow)
            if not await self._own_round(reader, turn, last_round):
                break
        report = chat.report_raw(turn.reported(), turn.rounds)
        headers = response_headers(upstream.raw_headers, report)
        return Relay(reader, headers, functools.partial(self.done, turn, status=200))

    async def _open(self, turn: Turn) -> Any:
        """The upstream stream of the turn's next request."""
        sent = time.perf_counter()
        payload = turn.payload(with_tools=turn.rounds < self.settings.max_tool_rounds)
        upstream = await self.upstream.open(
            "POST", turn.path, turn.headers, payload, base=turn.base
        )
        turn.upstream_s += time.perf_counter() - sent
        return upstream

    async def _own_round(self, reader: StreamReader, turn: Turn, last_round: int) -> bool:
        """True when the stream was a round of the proxy's own calls only (before anything
        else was said), answered now: the app's stream starts with the next round."""
        try:
            if await reader.decide() == "own" and turn.rounds < last_round:
                assistant = await reader.drain()
                mine, theirs = chat.split_calls(assistant, turn.own)
                if mine and not theirs:
                    reader.close()
                    await self._continue(turn, assistant, mine)
                    return True
        except STREAM_ERRORS as err:
            reader.close()
            message = f"upstream stream broke: {type(err).__name__}"
            raise Reject(502, message, "upstream_error") from err
        return False

    async def _next(self, turn: Turn, message: Message) -> Any:
        """At the end of a relayed stream whose reply is ``message``: the next round's
        upstream stream when the model called only the proxy's tools (answered now; the app
        sees the rounds as one reply), else None (see ``_settle``)."""
        if turn.body.get("n") not in (None, 1):  # several choices: no rounds (as whole)
            return None
        if not await self._settle(turn, message):
            return None
        try:
            upstream = await self._open(turn)
            if upstream.status != 200:
                status = (await self.upstream.read(upstream)).status_code
                raise Reject(status, f"upstream answered {status} to the proxy's tool round")
        except Reject as err:
            log.warning("serve.round_failed", session_id=turn.session_id, status=err.status)
            raise RoundFailed(err.message) from err
        return upstream

    def done(self, turn: Turn, reply: Message | None, status: int) -> None:
        """Log the request; hand history + reply to ``after_turn``, off the request path."""
        log.info(
            "serve.request",
            wire=turn.wire.name,
            session_id=turn.session_id,
            status=status,
            chars_in=turn.report.chars_in,
            chars_out=turn.reported().chars_out,
            generation=turn.report.generation,
            tool_rounds=turn.rounds,
            prepare_on_loop=turn.on_loop,
            duration_ms=round((time.perf_counter() - turn.started) * 1000, 3),
            proxy_ms=round(turn.overhead_ms(), 3),
        )
        if reply is None:
            return
        history = [*turn.history, *self._splice(turn, reply)]
        try:
            self._after.submit(self._after_turn, history, turn.session_id, turn.user_id)
        except RuntimeError:  # shutting down: the next request records these messages
            log.warning("serve.after_turn_skipped", session_id=turn.session_id)

    def _splice(self, turn: Turn, reply: Message | None) -> list[Message]:
        """What the model saw in place of ``reply`` (the reply the app got): when it saw
        more (the proxy's rounds, its own calls answered), that is kept to stand in the
        app's place in its next requests (``Splices``)."""
        if reply is None:
            return []
        seen = turn.seen(reply)
        if len(seen) == 1:
            return [reply]
        self.splices.record(turn.session_id, turn.client_len, reply, seen)
        return seen

    def _after_turn(self, history: list[Message], session_id: str, user_id: str | None) -> None:
        try:
            self.engine.after_turn(history, session_id=session_id, user_id=user_id)
        except Exception as err:  # the worker boundary: a bad reply must not stop the proxy
            log.error("serve.after_turn_failed", session_id=session_id, error=repr(err))


def _relayed(
    upstream: Reply, turn: Turn, *extra: tuple[bytes, bytes], content: bytes | None = None
) -> Response:
    """The upstream's reply as the app gets it, with the turn's report headers."""
    ours = [*chat.report_raw(turn.reported(), turn.rounds), *extra]
    headers = response_headers(upstream.headers, ours)
    return whole_response(
        upstream.status_code, headers, upstream.content if content is None else content
    )
