"""``MemoryEngine``: composes the store, the background work (``background.py``), the
sessions (``sessions.py``) and long-term memory (``memory.py``); it trims nothing itself. A
turn: ``Inputs.accept`` normalises the caller's messages (never mutated), ``Session.run`` runs
the turn's steps (``session.py``) and returns the ``Turn``, ``hand_out`` makes the copy handed
to the caller and ``Turn.report`` the ``TurnReport``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Self

import attrs

from ragent_memory.core import tracing
from ragent_memory.core.alternation import alternate
from ragent_memory.core.chars import Message, validate_messages
from ragent_memory.core.inputs import Inputs
from ragent_memory.core.logs import EventCallback, get_logger
from ragent_memory.core.records import Fact
from ragent_memory.engine.background import Background
from ragent_memory.engine.memory import ENGINE_HEADERS, LongTermMemory
from ragent_memory.engine.session import (
    LeaveCallback,
    PreparedContext,
    Services,
    Session,
    Turn,
    TurnReport,
    leading_system_count,
)
from ragent_memory.engine.sessions import Sessions, Validated
from ragent_memory.engine.tools import as_int, read_back
from ragent_memory.errors import (
    EngineClosedError,
    InvalidIdError,
    StoreError,
)
from ragent_memory.longterm.model import build_extractor
from ragent_memory.longterm.vocabulary import Extractor, memory_message
from ragent_memory.recall.excerpts import place
from ragent_memory.recall.recaller import (
    DEFAULT_SEARCH_LIMIT,
    DENSE_KEYS,
    Recaller,
    search_tool_schema,
)
from ragent_memory.recall.refs import DEFAULT_LIMIT, recall_tool_schema
from ragent_memory.settings import Settings, is_int, load_settings
from ragent_memory.store import GCReport, TurnLog, VectorIndex, open_store, utc_now
from ragent_memory.summary.build import build_summarizer
from ragent_memory.summary.summarize import Summarizer

__all__ = ["MemoryEngine", "PreparedContext", "TurnReport", "leading_system_count"]

log = get_logger(__name__)


def _check_id(name: str, value: Any, limit: int) -> None:
    """Refuse an id the store must not keep (before anything is written): not a non-empty
    string, longer than ``limit`` (``max_id_chars``), or not valid text (a lone surrogate,
    a NUL)."""
    if not isinstance(value, str) or not value:
        raise InvalidIdError(name, f"must be a non-empty string, got {value!r:.80}", limit=limit)
    if len(value) > limit:
        problem = f"{len(value)} characters, over the limit of {limit} (max_id_chars)"
        raise InvalidIdError(name, problem, limit=limit)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        problem = f"not valid text: a lone surrogate at index {err.start}"
        raise InvalidIdError(name, problem, limit=limit) from None
    if "\x00" in value:
        raise InvalidIdError(
            name, f"not valid text: NUL at index {value.index(chr(0))}", limit=limit
        )


def _check_ids(session_id: Any, user_id: Any, limit: int) -> None:
    _check_id("session_id", session_id, limit)
    if user_id is not None:
        _check_id("user_id", user_id, limit)


def hand_out(turn: Turn, block: str, *, strict: bool) -> list[Message]:
    """What the caller gets: a copy of the view (down to every content part and tool call, so
    an app decorating what it sends changes neither its history nor later turns) with the
    memory block after the leading system messages and the turn's recall block on its user
    message (§9b: the view never holds it); with ``strict``, the engine's inserted run
    (memory block, summary) merged into its neighbours for strict role alternation."""
    view = turn.view
    out = view.hand_out()
    if block:
        out.insert(leading_system_count(out), memory_message(block))
    if turn.recall_block:
        at = view.view_index(turn.recall_at) + bool(block)
        out[at] = place(out[at], turn.recall_block)
    if strict:
        out = alternate(out, range(view.prefix_len, view.head + bool(block)))
    return out


def _remaining(started: float, timeout_s: float | None) -> float | None:
    """What is left of ``timeout_s`` since ``started`` (``time.monotonic``); None: no limit."""
    return None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - started))


def _recall_index(
    store: VectorIndex, settings: Settings, on_leave: LeaveCallback | None
) -> tuple[Recaller | None, LeaveCallback | None]:
    """The recall index unless recall is off (both backends keep it, §9b), and what hears of
    messages leaving a view: the index, then the caller's ``on_leave``."""
    if not settings.recall_enabled:
        return None, on_leave
    recaller = Recaller(store, settings, engine_headers=ENGINE_HEADERS)
    callbacks = [recaller.on_leave, *([on_leave] if on_leave else [])]

    def on_leave_all(*args: Any) -> None:
        for callback in callbacks:
            callback(*args)

    return recaller, on_leave_all


def finish_turn(
    store: TurnLog, session: Session, turn: Turn, memory_chars: int, started: float, span: Any
) -> TurnReport:
    """The turn's report, its row for the audit page (``turns``) and its span's attributes;
    a failed write is logged, never raised: the turn stands."""
    duration_ms = (time.perf_counter() - started) * 1000
    report = turn.report(memory_chars=memory_chars, duration_ms=duration_ms)
    row = {
        **attrs.asdict(report),
        "user_id": turn.user_id,
        "messages": len(turn.history),
        "budget_chars": turn.budget,
        "covered": session.state.covered,
    }
    tracing.annotate(span, {f"ragent_memory.{k}": v for k, v in row.items()})
    try:
        store.record_turn(session.session_id, row, turn.user_id)
    except StoreError as err:
        log.error("turn.write_failed", session_id=session.session_id, error=repr(err))
    return report


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
        self.settings = settings = settings or Settings()
        self.on_event = on_event
        self.store = open_store(settings.store, clock=clock)
        self._inputs = Inputs()  # SDK objects and the developer role become chat dicts
        self.summarizer = summarizer or build_summarizer(settings, on_event=self._emit)
        # on_event stays about summaries (docs/design.md §13): memory calls are logged, not emitted.
        self.extractor = extractor or build_extractor(settings)
        self._background = Background(settings.compaction_workers)
        self._memory = LongTermMemory(self.store, settings, self.extractor, self._background)
        # the recall index (None: recall is off), public to look at
        self.recaller, on_leave = _recall_index(self.store, settings, on_leave)
        services = Services(
            settings=settings,
            store=self.store,
            summarizer=self.summarizer,
            submit=self._background.submit_compaction,
            emit=self._emit,
            on_leave=on_leave,
            recaller=self.recaller,
        )
        # The sessions in memory (``len``, ``get``), to look at: the engine's own to change.
        self.sessions = Sessions(self.store, services, settings.session_cache_size)
        self._validated = Validated(settings.session_cache_size)
        self._closed = False

    @classmethod
    def from_yaml(cls, path: str | Path, **kwargs: Any) -> MemoryEngine:
        return cls(load_settings(path), **kwargs)

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
        self._background.shutdown()
        if self.recaller is not None:
            self.recaller.close()
        self.summarizer.close()
        self.extractor.close()
        self.store.close()

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("engine is closed")

    def _check_user(self, user_id: str) -> None:
        self._check_open()
        _check_id("user_id", user_id, self.settings.max_id_chars)

    def flush(self, timeout_s: float | None = None, *, extract_pending: bool = False) -> bool:
        """Wait for every compaction and fact extraction in flight, at most ``timeout_s`` in
        all (None: until they finish). True when all finished; False on timeout (the work goes
        on, a later ``prepare`` applies a late summary; background work logs its failures).

        ``extract_pending``: then also learn from the messages still pending (fewer than the
        3 that start an extraction) for every user this engine recorded, so a last "I moved
        to Porto" is applied before shutdown."""
        started = time.monotonic()
        finished = self._background.wait(timeout_s)
        if finished and extract_pending:
            self._memory.schedule_pending()
            finished = self._background.wait(_remaining(started, timeout_s))
        try:
            if self.recaller is not None:
                self.recaller.flush(_remaining(started, timeout_s))
        except FutureTimeout:
            finished = False
        if not finished:
            log.warning("flush.timeout", timeout_s=timeout_s)
        return finished

    def _emit(self, name: str, data: dict[str, Any]) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(name, data)
        except Exception as err:  # the callback boundary: a broken callback must not break a turn
            log.error("on_event.failed", callback_event=name, error=repr(err))

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
        an edit is caught when the next compaction is due."""
        started = time.perf_counter()
        self._check_open()
        _check_ids(session_id, user_id, self.settings.max_id_chars)
        span = tracing.span("ragent_memory.prepare", {"ragent_memory.session_id": session_id})
        with span as current, self.sessions.held(session_id) as session, session.lock:
            given = messages
            messages = self._inputs.accept(given, plain=0 if verify else session.plain)
            turn = session.run(messages, user_id, verify=verify)
            session.plain = len(messages) if messages is given else 0
            block = self._memory.block(session, user_id)
            out = hand_out(turn, block, strict=self.settings.strict_alternation)
            report = finish_turn(self.store, session, turn, len(block), started, current)
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
        ``compaction_timeout_s`` is 0, or the session is in memory, idle, not moved on by
        another host, and ``messages`` are the dicts of its last ``prepare`` plus new ones too
        small to reach the compaction trigger (``turn.may_pass_trigger``). A caller that edits
        message dicts in place may get False for a turn that then rebuilds; ``serve`` never
        does. Costs one comparison per message and measures what is new."""
        settings = self.settings
        if not settings.summary_enabled or settings.compaction_timeout_s == 0:
            return False
        return self.sessions.may_wait(session_id, messages)

    def after_turn(
        self, messages: Sequence[Message], *, session_id: str, user_id: str | None = None
    ) -> None:
        """Record the user's new messages for long-term memory (docs/design.md §9). With 3 or more
        pending for the user (across sessions), one background extraction learns from them.

        Idempotent and restart-safe: a history passed again (or to a new engine on the same
        store) records only messages not recorded before. Without ``user_id``, or with
        ``long_term_enabled: false``, it only validates ``messages``.
        """
        self._check_open()
        _check_id("session_id", session_id, self.settings.max_id_chars)
        given, seen = messages, self._validated.seen(session_id, messages)
        messages = self._inputs.accept(given, plain=seen)
        recorded = True
        if user_id is None or not self.settings.long_term_enabled:
            validate_messages(messages, seen)
        else:
            _check_id("user_id", user_id, self.settings.max_id_chars)
            recorded = self._memory.record(user_id, session_id, messages)
        if recorded:
            self._validated.keep(session_id, given, messages)
        if self.recaller is not None:  # off the caller's thread (§9b): searchable later
            self.recaller.after_turn(messages, session_id=session_id, user_id=user_id)

    async def aafter_turn(
        self, messages: Sequence[Message], *, session_id: str, user_id: str | None = None
    ) -> None:
        """``after_turn`` off the event loop (it writes to the store)."""
        await asyncio.to_thread(self.after_turn, messages, session_id=session_id, user_id=user_id)

    def memories(self, user_id: str) -> list[Fact]:
        """The user's active facts (learnt from the user's own words only), oldest first;
        a running session's memory block shows a new one from its next compaction on."""
        self._check_user(user_id)
        return self.store.facts(user_id)

    def forget(self, user_id: str) -> None:
        """Erase everything remembered about the user: facts and summaries (whatever their
        status), their search index and pending messages. The next ``prepare`` shows no
        block (blocks are kept keyed by the user's memory version, which the forget
        changes); an extraction in flight finds its batch gone and writes nothing."""
        self._check_user(user_id)
        self._memory.forget(user_id)

    def forget_fact(self, user_id: str, fact_id: int) -> bool:
        """Erase one of the user's active facts (an id :meth:`memories` lists) and the earlier
        versions it superseded; False when the user has no such active fact (another user's
        id included). The next ``prepare`` shows a block without it."""
        self._check_user(user_id)
        if not is_int(fact_id):
            raise ValueError(f"fact_id must be an integer, got {fact_id!r}")
        return self._memory.forget_fact(user_id, fact_id)

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
        return read_back(self.store, session_id, ref, offset, limit)

    def search_tool(self) -> dict[str, Any]:
        """The OpenAI tool schema of ``search_memory(query, limit=5)`` (docs/design.md §9b)."""
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
        _check_ids(session_id, user_id, self.settings.max_id_chars)
        if self.recaller is None:
            return "[search_memory: recall is switched off for this engine]"
        return self.recaller.search(session_id, query, user_id, as_int(limit))

    def recall_memory(self) -> dict[str, int]:
        """What the in-process recall index holds (docs/design.md §17): ``bytes`` (within ``cap``,
        ``recall_memory_mb``), ``units_bytes`` (the indexes, without the kept texts),
        ``rows`` (indexed messages) and ``users``; with ``recall.embeddings``, ``vectors``
        held, ``vectors_bytes`` (in ``bytes``), ``vectors_left_out``, ``embed_calls`` and
        ``embed_failures`` (calls that failed or were skipped: recall went on with BM25);
        zeros when recall is off."""
        if self.recaller is None:
            cap = self.settings.recall_memory_mb * 1_000_000
            keys = ("bytes", "units_bytes", "rows", "users", *DENSE_KEYS)
            return {**dict.fromkeys(keys, 0), "cap": cap}
        return self.recaller.memory()

    def drop_session(self, session_id: str) -> None:
        """Drop a session: its summary and sticky substitutions go now, its recall refs stop
        resolving at once, and the next :meth:`gc` deletes its offloads. Audit rows stay; the
        id, used again, starts a fresh session."""
        self._check_open()
        self.sessions.drop(session_id, self.settings.compaction_timeout_s)
        if self.recaller is not None:  # no late index rows after the drop
            self.recaller.forget_session(session_id)
        with self.sessions.lock:  # no prepare may reload the session halfway through
            self.sessions.pop(session_id)
            self._validated.pop(session_id)
            self.store.drop_session(session_id)
        log.info("session.dropped", session_id=session_id)

    def gc(self) -> GCReport:
        """Delete expired offloads and everything left of dropped sessions; report it."""
        self._check_open()
        report = self.store.gc()
        log.info("gc.done", **attrs.asdict(report))
        return report
