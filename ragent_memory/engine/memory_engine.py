"""``MemoryEngine``: composes the store, the thread pools, the sessions and long-term memory.

It trims nothing itself. A turn (``prepare``)::

    accept       the caller's messages checked and normalised (never mutated)
    Session.run  sync → adopt → verify → build → reduce → trim → record → compact → ceiling
                 → recall → report  (``session.py`` describes each step)
    hand_out     the memory block inserted after the system messages (outside the gates),
                 then the copy handed to the caller (output post-processing goes here)

and after it, ``after_turn`` records the user's new messages; with 3 pending, one background
extraction per user (its own thread pool) turns them into facts (``longterm``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Self

import attrs

from ragent_memory.core.alternation import alternate
from ragent_memory.core.chars import Message, text_of, validate_message, validate_messages
from ragent_memory.core.inputs import Inputs
from ragent_memory.core.logs import EventCallback, get_logger
from ragent_memory.engine import compaction as compact
from ragent_memory.engine.session import (
    LeaveCallback,
    PreparedContext,
    Services,
    Session,
    TurnReport,
    View,
    leading_system_count,
)
from ragent_memory.engine.session import digest as message_digest
from ragent_memory.engine.tools import as_int
from ragent_memory.errors import EngineClosedError, InvalidMessagesError, StoreError
from ragent_memory.longterm.batch import (
    EXCERPT_CANDIDATES,
    HEADERS,
    MIN_EXCERPT_ROOM,
    Extractor,
    Fact,
    build_extractor,
    fit_block,
    memory_message,
    run_extraction,
    utf8,
)
from ragent_memory.recall.refs import DEFAULT_LIMIT, recall_slice, recall_tool_schema
from ragent_memory.recall.search import DEFAULT_SEARCH_LIMIT, Recaller, place, search_tool_schema
from ragent_memory.recall.search import HEADERS as RECALL_HEADERS
from ragent_memory.settings import EXTRACTION_MIN_PENDING, Settings, load_settings
from ragent_memory.store import GCReport, open_store, utc_now
from ragent_memory.summary.build import build_summarizer
from ragent_memory.summary.summarize import Summarizer
from ragent_memory.text.terms import fts_query, search_terms

__all__ = ["MemoryEngine", "PreparedContext", "TurnReport", "leading_system_count"]

log = get_logger(__name__)

MEMORY_WORKERS = 2  # background fact extractions at once (one per user at most)
_ENGINE_HEADERS = (
    *HEADERS.values(),
    *compact.SUMMARY_HEADERS.values(),
    *RECALL_HEADERS.values(),
)


def _check_id(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidMessagesError(None, f"{name} must be a non-empty string, got {value!r}")


def hand_out(view: View, block: str) -> list[Message]:
    """What the caller gets: the view with the memory block after the leading system
    messages, each message a copy down to every content part and tool call, so an app that
    decorates what it sends (cache_control on a part, a serializer popping keys) changes
    neither its own history nor what later turns send.

    A copy handed out is handed out again while it still equals the view: each turn copies
    again only those the caller changed, those the view replaced (a trim, a preview) and
    those new since (``View.hand_out``)."""
    out = view.hand_out()
    if block:
        at = leading_system_count(out)
        out.insert(at, memory_message(block))
    return out


class _Background:
    """Futures of background work in flight (compactions and fact extractions), so ``flush``
    and ``close`` can wait for all of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: set[Future[Any]] = set()

    def submit(
        self, pool: ThreadPoolExecutor, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Future[Any] | None:
        """Run ``fn`` on ``pool``; None when the pool takes no more work (engine closing)."""
        try:
            future = pool.submit(fn, *args, **kwargs)
        except RuntimeError:
            return None
        with self._lock:
            self._futures.add(future)
        future.add_done_callback(self._done)
        return future

    def _done(self, future: Future[Any]) -> None:
        with self._lock:
            self._futures.discard(future)

    def wait(self, timeout_s: float | None) -> bool:
        """Wait for the work in flight now; True when all of it finished within the time."""
        with self._lock:
            futures = list(self._futures)
        return not wait(futures, timeout=timeout_s).not_done


def _both(recaller: Recaller, on_leave: LeaveCallback) -> LeaveCallback:
    def leave(session_id: str, user_id: str | None, items: list[tuple[int, Message]]) -> None:
        recaller.on_leave(session_id, user_id, items)
        on_leave(session_id, user_id, items)

    return leave


class MemoryEngine:
    """The memory engine. One instance serves many threads and sessions."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        on_event: EventCallback | None = None,
        clock: Callable[[], Any] = utc_now,
        summarizer: Summarizer | None = None,
        extractor: Extractor | None = None,
        on_leave: LeaveCallback | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self.on_event = on_event
        self.store = open_store(self.settings.store, clock=clock)
        self._inputs = Inputs()  # SDK objects and the developer role become chat dicts
        self.summarizer = summarizer or build_summarizer(self.settings, on_event=self._emit)
        # on_event stays about summaries (DESIGN §13): memory calls are logged, not emitted.
        self.extractor = extractor or build_extractor(self.settings)
        self._pool = ThreadPoolExecutor(
            max_workers=self.settings.compaction_workers, thread_name_prefix="ragent-compact"
        )
        self._memory_pool = ThreadPoolExecutor(
            max_workers=MEMORY_WORKERS, thread_name_prefix="ragent-memory"
        )
        self._background = _Background()
        self._extractions: dict[str, Future[Any]] = {}  # user_id → the one in flight
        self._extractions_lock = threading.Lock()
        self._pending_users: set[str] = set()  # users with messages recorded by this engine
        self._recaller: Recaller | None = None
        leave = on_leave
        if self.settings.recall_enabled:  # both backends keep the index (DESIGN §9b)
            self._recaller = Recaller(self.store, self.settings, engine_headers=_ENGINE_HEADERS)
            leave = self._recaller.on_leave if on_leave is None else _both(self._recaller, on_leave)
        self._services = Services(
            settings=self.settings,
            store=self.store,
            summarizer=self.summarizer,
            submit=self._submit_compaction,
            emit=self._emit,
            on_leave=leave,
            recaller=self._recaller,
        )
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # least recently used first
        self._sessions_lock = threading.Lock()
        # session → the plain messages after_turn was last given (a list of its own, grown by
        # what is new each call): the next call of an app that appends converts and validates
        # only what is new
        self._validated: OrderedDict[str, list[Message]] = OrderedDict()
        self._closed = False

    @classmethod
    def from_yaml(cls, path: str | Path, **kwargs: Any) -> MemoryEngine:
        return cls(load_settings(path), **kwargs)

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Wait for background work in flight, then close the store. Idempotent; every other
        call afterwards raises ``EngineClosedError``."""
        if self._closed:
            return
        self._closed = True
        self._memory_pool.shutdown(wait=True)
        self._pool.shutdown(wait=True)
        if self._recaller is not None:
            self._recaller.close()
        self.summarizer.close()
        self.extractor.close()
        self.store.close()

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("engine is closed")

    def flush(self, timeout_s: float | None = None, *, extract_pending: bool = False) -> bool:
        """Wait for every compaction and fact extraction in flight, at most ``timeout_s`` in
        all (None: until they finish). True when all finished; False on timeout (the work goes
        on and a later ``prepare`` adopts a late summary). Background work audits and logs its
        own failures.

        ``extract_pending``: then also learn from the messages still pending (fewer than the
        3 that start an extraction) for every user this engine recorded, so a last "I moved
        to Porto" is applied before shutdown."""
        started = time.monotonic()

        def left() -> float | None:
            return None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - started))

        finished = self._background.wait(timeout_s)
        if finished and extract_pending:
            with self._extractions_lock:
                users = sorted(self._pending_users)
                self._pending_users.clear()
            for user_id in users:
                self._schedule_extraction(user_id)
            finished = self._background.wait(left())
        try:
            if self._recaller is not None:
                self._recaller.flush(left())
        except FutureTimeout:
            finished = False
        if not finished:
            log.warning("flush.timeout", timeout_s=timeout_s)
        return finished

    def _submit_compaction(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._background.submit(self._pool, fn, *args, **kwargs)

    def _emit(self, name: str, data: dict[str, Any]) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(name, data)
        except Exception as err:  # the callback boundary: a broken callback must not break a turn
            log.error("on_event.failed", callback_event=name, error=repr(err))

    def _session(self, session_id: str) -> Session:
        written = self.store.last_write(session_id)
        with self._sessions_lock:
            session = self._sessions.get(session_id)
            if (
                session is not None
                and written is not None
                and written[0] != self.store.host_id
                and written != session.last_write
                and (session.future is None or session.future.done())
            ):
                session = None  # another host moved the session on: continue from the store
            if session is None:
                # A dropped id used again starts a new life; a late compaction of the old
                # life (still marked dropped until now) could not commit meanwhile.
                self.store.revive(session_id)
                state = self.store.load_session(session_id) or self.store.new_session(session_id)
                subs = self.store.substitutions(session_id)
                session = Session(state, subs, self._services)
                session.last_write = written
                self._sessions[session_id] = session
            self._sessions.move_to_end(session_id)
            session.callers += 1
            return session

    def _release(self, session: Session) -> None:
        """A call is done with ``session``; evict idle sessions over the cache size."""
        with self._sessions_lock:
            session.callers -= 1
            excess = len(self._sessions) - self.settings.session_cache_size
            if excess <= 0:
                return
            for session_id in list(self._sessions)[:excess]:
                if self._sessions[session_id].is_idle():
                    del self._sessions[session_id]

    # ------------------------------------------------------------------ the turn

    def prepare(
        self,
        messages: Sequence[Message],
        *,
        session_id: str,
        user_id: str | None = None,
        verify: bool = False,
    ) -> PreparedContext:
        """Fit ``messages`` into the budget. Never mutates them; raw history is never lost.

        The usual app appends to one list: only what is new is read, plus an identity check
        of what the view shows. ``verify=True`` also compares every earlier message by digest
        (an edit inside a content part of a message the summary covers, say); without it such
        an edit is caught when the next compaction is due (see README, "Speed")."""
        started = time.perf_counter()
        self._check_open()
        _check_id("session_id", session_id)
        if user_id is not None:
            _check_id("user_id", user_id)
        session = self._session(session_id)
        try:
            with session.lock:
                given = messages
                messages = self._inputs.accept(given, plain=0 if verify else session.plain)
                view, fields = session.run(messages, user_id, verify=verify)
                session.plain = len(messages) if messages is given else 0
                block = self._memory_block(session, user_id)
                out = hand_out(view, block)
                if session.recall_block:  # on the copy: the view never holds it (§9b)
                    at = session.recall_at - view.offset + bool(block)
                    out[at] = place(out[at], session.recall_block)
                if self.settings.strict_alternation:  # engine-inserted run: block + summary
                    out = alternate(out, range(view.prefix_len, view.head + bool(block)))
        finally:
            self._release(session)
        duration_ms = (time.perf_counter() - started) * 1000
        report = TurnReport(**fields, memory_chars=len(block), duration_ms=duration_ms)
        return PreparedContext(out, report)

    async def aprepare(
        self,
        messages: Sequence[Message],
        *,
        session_id: str,
        user_id: str | None = None,
        verify: bool = False,
    ) -> PreparedContext:
        """``prepare`` off the event loop (compaction may wait on a model)."""
        return await asyncio.to_thread(
            self.prepare, messages, session_id=session_id, user_id=user_id, verify=verify
        )

    def prepare_may_wait(self, messages: Sequence[Message], *, session_id: str) -> bool:
        """Whether ``prepare(messages, session_id=…)`` called now could wait on a
        compaction (at most ``compaction_timeout_s``). False only when it provably cannot, so
        an event loop may call ``prepare`` inline (``serve`` does): summaries are off,
        ``compaction_timeout_s`` is 0, or the session is in memory, idle (no call holds it,
        no compaction in flight, no other host moved it on) and ``messages`` are the dicts
        of its last ``prepare`` (or equal ones) plus new ones too small to bring its view
        past the compaction trigger (the view then only grows by what is appended, as in
        ``Session.may_wait``; a view under the trigger is under B as well, so the
        ceiling's mid-turn compaction cannot start either). A caller that edits message
        dicts in place may get False for a turn that then rebuilds; ``serve`` never does.
        Costs one comparison per message (at C speed, the same dict is equal at once) and
        measures what is new."""
        settings = self.settings
        if not settings.summary_enabled or settings.compaction_timeout_s == 0:
            return False
        with self._sessions_lock:
            session = self._sessions.get(session_id)
        if session is None or session.may_wait(messages):
            return True
        written = self.store.last_write(session_id)
        # another host wrote: prepare reloads the session
        return written not in (None, session.last_write) and written[0] != self.store.host_id

    # ------------------------------------------------------------------ long-term memory

    def _memory_block(self, session: Session, user_id: str | None) -> str:
        """The user's memory block for this session ("" for none), rebuilt only when the
        user's memories changed since it was last built (a version in the store)."""
        if not user_id or not self.settings.long_term_enabled:
            return ""
        try:
            version = self.store.memory_version(user_id)
            cached = session.memory
            if cached is not None and cached[:2] == (user_id, version):
                return cached[2]
            block = self._build_block(session, user_id) if version else ""
        except StoreError as err:  # memory is background: a store failure must not break a turn
            log.error("memory.read_failed", user_id=user_id, error=repr(err))
            return ""
        session.memory = (user_id, version, block)
        return block

    def _build_block(self, session: Session, user_id: str) -> str:
        language, cap = self.settings.language, self.settings.memory_max_chars
        facts = [f.content for f in self.store.facts(user_id)]
        block = fit_block(facts, (), language=language, max_chars=cap)
        if cap - len(block) < MIN_EXCERPT_ROOM:
            return block
        latest = next(
            (text_of(m) for m in reversed(session.raw.messages) if m.get("role") == "user"), ""
        )
        terms = search_terms(latest)
        if not terms:
            return block
        excerpts = self.store.search_summaries(
            user_id,
            fts_query(terms),
            exclude_session=session.state.session_id,
            limit=EXCERPT_CANDIDATES,
        )
        return fit_block(facts, excerpts, language=language, max_chars=cap)

    def after_turn(
        self, messages: Sequence[Message], *, session_id: str, user_id: str | None = None
    ) -> None:
        """Record the user's new messages for long-term memory (DESIGN §9). With 3 or more
        pending for the user (across sessions), one background extraction learns from them.

        Idempotent and restart-safe: a history passed again (or to a new engine on the same
        store) records only messages not recorded before. Without ``user_id``, or with
        ``long_term_enabled: false``, it only validates ``messages``.
        """
        self._check_open()
        _check_id("session_id", session_id)
        given, (seen, known) = messages, self._seen_before(session_id, messages)
        messages = self._inputs.accept(given, plain=seen)
        if user_id is None or not self.settings.long_term_enabled:
            validate_messages(messages, seen)
            self._remember(session_id, given, messages, known)
            self._index(messages, session_id, user_id)
            return
        _check_id("user_id", user_id)
        try:
            pending = self._record_user_messages(user_id, session_id, messages)
        except StoreError as err:
            log.error("memory.record_failed", user_id=user_id, error=repr(err))
            self._index(messages, session_id, user_id)
            return
        self._remember(session_id, given, messages, known)
        with self._extractions_lock:
            self._pending_users.add(user_id)
        self._index(messages, session_id, user_id)
        if pending >= EXTRACTION_MIN_PENDING:
            self._schedule_extraction(user_id)

    def _seen_before(
        self, session_id: str, messages: Sequence[Message]
    ) -> tuple[int, list[Message] | None]:
        """How many leading ``messages`` are the plain, valid ones the session's last
        ``after_turn`` was given, and (when any) that list grown to ``messages``, for
        ``_remember`` to keep. The list is extended by what is new and compared with
        ``messages`` in one C-level ``==``, which meets the same objects without reading
        them: an app appending to its list has only its new messages touched, converted and
        validated (a slice or a copy of the whole history would touch every message, twice,
        each turn). The list is this call's until ``_remember`` puts it back: a concurrent
        call on the session reads everything."""
        with self._sessions_lock:
            seen = self._validated.pop(session_id, None)
        if not seen or not isinstance(messages, list) or len(messages) < len(seen):
            return 0, None
        known = len(seen)
        seen += messages[known:]
        try:
            same = seen == messages
        except Exception:  # a value whose == raises: read everything, validation names it
            same = False
        return (known, seen) if same else (0, None)

    def _remember(
        self, session_id: str, given: Any, accepted: Sequence[Message], seen: list[Message] | None
    ) -> None:
        """Keep what a successful ``after_turn`` was given, when it was plain chat dicts
        (``seen``: ``_seen_before``'s list, already equal to it)."""
        if accepted is not given or not isinstance(given, list):
            return
        kept = list(given) if seen is None else seen
        with self._sessions_lock:
            self._validated[session_id] = kept
            self._validated.move_to_end(session_id)
            while len(self._validated) > self.settings.session_cache_size:
                self._validated.popitem(last=False)

    def _index(self, messages: Sequence[Message], session_id: str, user_id: str | None) -> None:
        """The session's text into the recall index, off the caller's thread (§9b), so
        sessions that never compact are searchable from the user's later sessions."""
        if self._recaller is not None:
            self._recaller.after_turn(messages, session_id=session_id, user_id=user_id)

    def _record_user_messages(
        self, user_id: str, session_id: str, messages: Sequence[Message]
    ) -> int:
        seen, last_digest = self.store.memory_cursor(user_id, session_id) or (0, "")
        start = 0
        if 0 < seen <= len(messages):  # the usual append-only app: read only what is new
            validate_message(messages[seen - 1], seen - 1)
            if message_digest(messages[seen - 1], seen - 1) == last_digest:
                start = seen
        validate_messages(messages, start)
        items = []
        for index in range(start, len(messages)):
            message = messages[index]
            text = text_of(message).strip() if message.get("role") == "user" else ""
            if text and not text.startswith(_ENGINE_HEADERS):  # never learn from our own blocks
                items.append((index, message_digest(message, index), utf8(text)))
        return self.store.record_user_messages(
            user_id,
            session_id,
            items,
            seen=len(messages),
            last_digest=message_digest(messages[-1], len(messages) - 1) if messages else "",
        )

    async def aafter_turn(
        self, messages: Sequence[Message], *, session_id: str, user_id: str | None = None
    ) -> None:
        """``after_turn`` off the event loop (it writes to the store)."""
        await asyncio.to_thread(self.after_turn, messages, session_id=session_id, user_id=user_id)

    def _schedule_extraction(self, user_id: str) -> None:
        with self._extractions_lock:
            running = self._extractions.get(user_id)
            if running is not None and not running.done():
                return  # never two at once for a user; the next turn schedules again
            future = self._background.submit(self._memory_pool, self._extract, user_id)
            if future is None:  # the engine is closing; the batch waits for the next run
                log.warning("memory.not_scheduled", user_id=user_id, reason="closed")
                return
            self._extractions[user_id] = future
        future.add_done_callback(lambda done: self._forget_future(user_id, done))

    def _forget_future(self, user_id: str, future: Future[Any]) -> None:
        with self._extractions_lock:
            if self._extractions.get(user_id) is future:
                del self._extractions[user_id]

    def _extract(self, user_id: str) -> None:
        try:
            run_extraction(self.store, self.extractor, user_id, settings=self.settings)
        except Exception as err:  # the worker boundary: log a crash, keep the pool alive
            log.error("memory.crashed", user_id=user_id, error=repr(err))

    def memories(self, user_id: str) -> list[Fact]:
        """The user's active facts, oldest first."""
        self._check_open()
        _check_id("user_id", user_id)
        return self.store.facts(user_id)

    def forget(self, user_id: str) -> None:
        """Erase everything remembered about the user: facts and summaries (whatever their
        status), their search index and pending messages. The next ``prepare`` shows no
        block (cached blocks are keyed by the user's memory version, which the forget
        changes); an extraction in flight finds its batch gone and writes nothing."""
        self._check_open()
        _check_id("user_id", user_id)
        forgotten = self.store.forget(user_id)
        log.info("memory.forgotten", user_id=user_id, **attrs.asdict(forgotten))

    # ------------------------------------------------------------------ recall and lifecycle

    def recall_tool(self) -> dict[str, Any]:
        """The OpenAI tool schema the model calls to read back an offloaded result."""
        return recall_tool_schema()

    def recall(
        self,
        session_id: str,
        ref: str,
        offset: int = 0,
        limit: int = DEFAULT_LIMIT,
        **_unknown: Any,  # a model's extra arguments (``reason``…) are ignored
    ) -> str:
        """``original[offset:offset + limit]`` of an offloaded original, then a footer saying
        how many chars remain. Whatever the model passed, the answer is text it can read (never
        an exception, never another session's data): an unknown, expired, dropped or
        other-session ref, or a bad offset or limit, gets a clear refusal."""
        self._check_open()
        key = ref.strip() if isinstance(ref, str) else None
        original = None
        if key and isinstance(session_id, str):
            try:
                if self._recaller is not None:  # a recall block's refs, still queued
                    self._recaller.settle(session_id)
                original = self.store.read_offload(session_id, key)
            except StoreError as err:
                log.error("recall.failed", session_id=session_id, ref=key, error=repr(err))
                return "[recall: the store could not be read just now; try again later]"
        return recall_slice(original, ref, as_int(offset), as_int(limit))

    def search_tool(self) -> dict[str, Any]:
        """The OpenAI tool schema of ``search_memory(query, limit=5)`` (DESIGN §9b)."""
        return search_tool_schema()

    def search(
        self,
        session_id: str,
        query: str,
        user_id: str | None = None,
        limit: int = DEFAULT_SEARCH_LIMIT,
    ) -> str:
        """Excerpts of earlier conversation matching ``query``, as text the model reads: this
        session's messages and, with ``user_id``, that user's other sessions (never another
        user's). A bad query or limit gets a clear refusal, never an exception; ``"5"`` and
        ``5.0`` are read as 5, as :meth:`recall` reads its numbers."""
        self._check_open()
        _check_id("session_id", session_id)
        if user_id is not None:
            _check_id("user_id", user_id)
        if self._recaller is None:
            return "[search_memory: recall is switched off for this engine]"
        return self._recaller.search(session_id, query, user_id, as_int(limit))

    def drop_session(self, session_id: str) -> None:
        """Drop a session: its summary and sticky substitutions go now, its recall refs stop
        resolving at once, and the next :meth:`gc` deletes its offloads. Audit rows stay; the
        id, used again, starts a fresh session."""
        self._check_open()
        with self._sessions_lock:
            session = self._sessions.pop(session_id, None)
        if session is not None:
            with session.lock:  # let a prepare in flight finish first
                future = session.future
            # A compaction still running cannot commit after the drop (the store refuses it as
            # stale); flush() still waits for it.
            if future is not None and wait([future], self.settings.compaction_timeout_s)[1]:
                log.warning("drop_session.compaction_still_running", session_id=session_id)
        if self._recaller is not None:  # no late index rows after the drop
            self._recaller.forget_session(session_id)
        with self._sessions_lock:  # no prepare may reload the session halfway through
            self._sessions.pop(session_id, None)
            self._validated.pop(session_id, None)
            self.store.drop_session(session_id)
        log.info("session.dropped", session_id=session_id)

    def gc(self) -> GCReport:
        """Delete expired offloads and everything left of dropped sessions; report it."""
        self._check_open()
        report = self.store.gc()
        log.info("gc.done", **attrs.asdict(report))
        return report
