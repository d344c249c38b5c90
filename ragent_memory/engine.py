"""``MemoryEngine``: composes the gates, owns the store, the caches and the threads.

It trims nothing itself: each gate is a pure function in its own module. Per turn::

    view = leading system msgs + [summary msg] + raw[covered:]   (sticky substitutions applied)
      → reduce (oversized single results) → trim (50%) → compact (80%, thread pool)
      → [memory block] inserted after the system messages (outside the gates)

and after it, ``after_turn`` records the user's new messages; with 3 pending, one background
extraction per user (its own thread pool) turns them into facts (``longterm``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Self

import attrs
import structlog

from . import compact
from .chars import Message, chars, text_of, validate_message, validate_messages
from .errors import InvalidMessagesError, RagentMemoryError, StoreError
from .longterm import (
    EXCERPT_CANDIDATES,
    HEADERS,
    MIN_EXCERPT_ROOM,
    Extractor,
    Fact,
    build_extractor,
    fit_block,
    fts_query,
    memory_message,
    run_extraction,
    search_terms,
    utf8,
)
from .recall import DEFAULT_LIMIT, recall_slice, recall_tool_schema
from .reduce import reduce
from .settings import EXTRACTION_MIN_PENDING, Settings, load_settings
from .store import GCReport, SessionState, Store, Substitution, substitution_key, utc_now
from .summarize import Summarizer, build_summarizer
from .trim import find_candidates, trim, worth_it
from .view import RawCache, View, chain_digest
from .view import digest as message_digest

log = structlog.get_logger(__name__)

EventCallback = Callable[[str, dict[str, Any]], None]

MEMORY_WORKERS = 2  # background fact extractions at once (one per user at most)
_ENGINE_HEADERS = (*HEADERS.values(), *compact.SUMMARY_HEADERS.values())


@attrs.frozen
class TurnReport:
    """What one ``prepare`` did, in characters (DESIGN §11)."""

    chars_raw: int  # the whole caller history
    chars_in: int  # the view before the gates (summary + raw tail, nothing substituted)
    chars_out: int  # what is sent, memory block excluded
    trimmed: int  # tool results shown as placeholders
    truncated: int  # messages shown as head/tail previews
    reclaimed_chars: int  # chars saved by placeholders and previews in this view
    compacted: bool  # a summary generation was applied in this call
    skipped_reason: str | None  # why compaction did not run, when it was considered
    generation: int  # the session's current summary generation, 0 = none
    memory_chars: int  # the long-term memory block, injected after the gates (0 = none)
    duration_ms: float


@attrs.frozen
class PreparedContext:
    messages: list[Message]
    report: TurnReport


_New = tuple[int, Substitution, Sequence[str]]  # (view index, substitution, texts to offload)


@attrs.frozen
class _Tail:
    """The tail of the last view as shown, so the next turn only processes what is new."""

    start: int  # raw index of the first tail message
    head: int  # view index of the first tail message
    end: int  # raw length the tail was built from
    messages: list[Message]
    sizes: list[int]
    originals: dict[int, Message]
    kinds: dict[int, str]

    @classmethod
    def of(cls, view: View, end: int) -> _Tail:
        head = view.head
        return cls(
            head + view.offset,
            head,
            end,
            view.messages[head:],
            view.sizes[head:],
            dict(view.originals),
            dict(view.kinds),
        )


class _Session:
    """In-memory state of one session; every field is guarded by ``lock``."""

    def __init__(self, state: SessionState, subs: dict[str, Substitution], store: Store) -> None:
        self.lock = threading.Lock()
        self.state = state
        self.subs = subs
        self.store = store
        self._sizes: dict[str, tuple[Substitution, int]] = {}
        self.tail: _Tail | None = None
        # (reclaimable chars left, recent_start) of the last trim over a view that has only
        # grown at its end since; None when unknown.
        self.trim_hint: tuple[int, int] | None = None
        self.next_hint: tuple[int, int] | None = None  # set by a trim, kept once recorded
        self.warned_irregular = False
        self.raw = RawCache()
        self.verified_digest = ""  # covered_digest already checked against ``raw``
        self.future: Future[SessionState | None] | None = None
        self.returned_generation = state.generation
        # (user_id, memory version, block text) of the last memory block built for this
        # session: rebuilt only when that user's memories change, so the prefix stays stable.
        self.memory: tuple[str, int, str] | None = None

    def size_of(self, sub: Substitution) -> int:
        cached = self._sizes.get(sub.key)
        if cached is None or cached[0] is not sub:  # a preview later trimmed has a new sub
            cached = self._sizes[sub.key] = (sub, chars(sub.message))
        return cached[1]

    def ref_for(self, text: str) -> str:
        return self.store.ref_for(self.state.session_id, text)


def _check_id(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidMessagesError(None, f"{name} must be a non-empty string, got {value!r}")


def _key(session: _Session, view: View, index: int) -> str:
    """The substitution key of the caller's message shown at view ``index``."""
    raw_index = index + view.offset
    return substitution_key(raw_index - view.prefix_len, session.raw.digests[raw_index])


def leading_system_count(messages: Sequence[Message]) -> int:
    count = 0
    while count < len(messages) and messages[count].get("role") == "system":
        count += 1
    return count


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
    ) -> None:
        self.settings = settings or Settings()
        self.on_event = on_event
        self.store = Store(self.settings.store.path, clock=clock)
        self.summarizer = summarizer or build_summarizer(self.settings, on_event=self._emit)
        # on_event stays about summaries (DESIGN §13): memory calls are logged, not emitted.
        self.extractor = extractor or build_extractor(self.settings)
        self._pool = ThreadPoolExecutor(
            max_workers=self.settings.compaction_workers, thread_name_prefix="ragent-compact"
        )
        self._memory_pool = ThreadPoolExecutor(
            max_workers=MEMORY_WORKERS, thread_name_prefix="ragent-memory"
        )
        self._extractions: dict[str, Future[None]] = {}  # user_id → the one in flight
        self._extractions_lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        self._sessions_lock = threading.Lock()
        self._detached: list[Future[Any]] = []  # compactions of dropped sessions, still running
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
        """Wait for background work, then close the store. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._memory_pool.shutdown(wait=True)
        self._pool.shutdown(wait=True)
        self.summarizer.close()
        self.extractor.close()
        self.store.close()

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait for every in-flight compaction and fact extraction (bounded by ``timeout_s``
        each, default ``compaction_timeout_s``)."""
        with self._sessions_lock:
            futures: list[Future[Any]] = [
                s.future for s in self._sessions.values() if s.future is not None
            ]
            futures += self._detached
            self._detached = [f for f in self._detached if not f.done()]
        with self._extractions_lock:
            futures += self._extractions.values()
        for future in futures:
            try:
                future.result(timeout=timeout_s or self.settings.compaction_timeout_s)
            except FutureTimeout:
                log.warning("flush.timeout")
            except Exception as err:  # background work audits and logs its own failures
                log.error("flush.background_failed", error=repr(err))

    def _emit(self, name: str, data: dict[str, Any]) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(name, data)
        except Exception as err:  # a broken callback must not break a turn
            log.error("on_event.failed", event=name, error=repr(err))

    def _session(self, session_id: str) -> _Session:
        with self._sessions_lock:
            session = self._sessions.get(session_id)
            if session is None:
                # A dropped id used again starts a new life; a late compaction of the old
                # life (still marked dropped until now) could not commit meanwhile.
                self.store.revive(session_id)
                state = self.store.load_session(session_id) or SessionState(session_id)
                session = _Session(state, self.store.substitutions(session_id), self.store)
                self._sessions[session_id] = session
            return session

    # ------------------------------------------------------------------ the turn

    def prepare(
        self, messages: Sequence[Message], *, session_id: str, user_id: str | None = None
    ) -> PreparedContext:
        """Fit ``messages`` into the budget. Never mutates them; raw history is never lost."""
        started = time.perf_counter()
        if self._closed:
            raise RagentMemoryError("engine is closed")
        if not isinstance(session_id, str) or not session_id:
            raise InvalidMessagesError(
                None, f"session_id must be a non-empty string, got {session_id!r}"
            )
        if not isinstance(messages, list | tuple):
            raise InvalidMessagesError(
                None, f"expected a list of messages, got {type(messages).__name__}"
            )
        session = self._session(session_id)
        with session.lock:
            session.raw.sync(messages)
            self._adopt_late_compaction(session)
            self._check_covered(session, user_id)
            view, report = self._run_gates(session, user_id)
            block = self._memory_block(session, user_id)
        if block:
            at = leading_system_count(view)
            view = [*view[:at], memory_message(block), *view[at:]]
            report = attrs.evolve(report, memory_chars=len(block))
        duration_ms = (time.perf_counter() - started) * 1000
        return PreparedContext(view, attrs.evolve(report, duration_ms=duration_ms))

    async def aprepare(
        self, messages: Sequence[Message], *, session_id: str, user_id: str | None = None
    ) -> PreparedContext:
        """``prepare`` off the event loop (compaction may wait on a model)."""
        return await asyncio.to_thread(
            self.prepare, messages, session_id=session_id, user_id=user_id
        )

    def _view(self, session: _Session) -> tuple[View, int]:
        """The view before the gates with sticky substitutions shown, and its total before
        any substitution (``chars_in``)."""
        raw = session.raw
        state = session.state
        prefix_len = leading_system_count(raw.messages)
        messages: list[Message] = list(raw.messages[:prefix_len])
        sizes = raw.sizes[:prefix_len]
        start = prefix_len
        if state.generation:
            summary = compact.summary_message(state.summary, self.settings.language)
            messages.append(summary)
            sizes.append(chars(summary))
            start = state.covered
        head = len(messages)
        chars_in = sum(sizes) + sum(raw.sizes[start:])
        view = View(messages, sizes, head, start - head)
        view.prefix_len = prefix_len
        # Reuse last turn's tail as shown, when the history before its end is unchanged.
        cache = session.tail
        begin = start
        if (
            cache is not None
            and (cache.start, cache.head) == (start, head)
            and raw.unchanged(start, cache.end)
        ):
            messages.extend(cache.messages)
            sizes.extend(cache.sizes)
            view.originals = dict(cache.originals)
            view.kinds = dict(cache.kinds)
            view.carried = True
            begin = cache.end
        else:
            session.trim_hint = None
        view.fresh = len(messages)
        messages.extend(raw.messages[begin:])
        sizes.extend(raw.sizes[begin:])
        subs = session.subs
        for raw_index, digest in enumerate(raw.digests[begin:], start=begin):
            sub = subs.get(substitution_key(raw_index - prefix_len, digest))
            if sub is not None:
                view.show(raw_index - view.offset, sub.message, sub.kind, session.size_of(sub))
        return view, chars_in

    def _reduce(self, session: _Session, view: View) -> list[_New]:
        """Substitutions for oversized messages not shown in another form yet."""
        limit = self.settings.oversized_tool_result_chars
        sizes, kinds = view.sizes, view.kinds
        candidates = [
            i for i in range(view.fresh, len(sizes)) if sizes[i] > limit and i not in kinds
        ]
        if not candidates:
            return []
        reduced = reduce(
            view.messages,
            limit_chars=limit,
            language=self.settings.language,
            ref_for=session.ref_for,
            candidates=candidates,
        )
        return [
            (
                t.index,
                Substitution(_key(session, view, t.index), "truncate", t.refs[0], t.replacement),
                t.offloaded,
            )
            for t in reduced.truncations
        ]

    def _trim(self, session: _Session, view: View, new: list[_New]) -> list[_New]:
        """Gate 1 over the view as it would be with ``new`` shown; returns the substitutions
        to record (a trimmed result replaces its pending preview). The skip hint for later
        turns waits in ``session.next_hint`` until those substitutions are recorded."""
        tentative = view.copy()
        for index, sub, _ in new:
            tentative.show(index, sub.message, sub.kind, session.size_of(sub))
        if tentative.total <= self.settings.trim_trigger_chars:
            return new
        if self._still_not_worth_it(session, view, tentative):
            return new  # the common turn: only the recent stretch was looked at
        session_id = session.state.session_id
        try:
            result = trim(
                tentative.messages,
                trigger_chars=self.settings.trim_trigger_chars,
                evictable_tools=self.settings.evictable_tools,
                language=self.settings.language,
                ref_for=session.ref_for,
                originals=tentative.originals,
                evicted=tentative.indexes("trim"),
                sizes=tentative.sizes,
            )
        except Exception as err:  # the trim must never break a turn (DESIGN §4)
            log.error("trim.failed", session_id=session_id, error=repr(err))
            return new
        left = 0 if result.evictions else result.reclaimable_chars
        session.next_hint = (left, result.recent_start)  # kept once the evictions are recorded
        if result.irregular and not session.warned_irregular:
            session.warned_irregular = True  # once per session: the caller's input, not ours
            log.warning("messages.irregular", session_id=session_id, **result.irregular)
        if not result.evictions:
            return new
        evicted = {e.index for e in result.evictions}
        log.info(
            "trim.applied",
            session_id=session_id,
            trimmed=len(evicted),
            reclaimed_chars=result.reclaimed_chars,
            chars_in=tentative.total,
            chars_out=tentative.total - result.reclaimed_chars,
        )
        return [n for n in new if n[0] not in evicted] + [
            (
                e.index,
                Substitution(_key(session, view, e.index), "trim", e.ref, e.replacement),
                (e.text,),
            )
            for e in result.evictions
        ]

    def _still_not_worth_it(self, session: _Session, view: View, tentative: View) -> bool:
        """Decide the 20% rule from the recent stretch alone, when possible.

        After a trim, nothing before its ``recent_start`` can become a candidate, and what the
        candidates there free is known. If the view has only grown at its end since, the
        candidates now are those plus the ones in the stretch from ``recent_start`` on; when
        together they stay under 20%, the trim would change nothing and is skipped without
        scanning the whole view. The hint moves forward for the next turn.
        """
        hint = session.trim_hint if view.carried else None
        if hint is None:
            return False
        left, start = hint
        found = find_candidates(
            tentative.messages[start:],
            evictable_tools=self.settings.evictable_tools,
            language=self.settings.language,
            ref_for=session.ref_for,
            sizes=tentative.sizes[start:],
            originals={i - start: m for i, m in tentative.originals.items() if i >= start},
            evicted={i - start for i in tentative.indexes("trim") if i >= start},
        )
        if worth_it(left + found.reclaim_chars, tentative.total):
            return False
        session.next_hint = (left + found.reclaim_chars, start + found.recent_start)
        return True

    def _record(self, session: _Session, view: View, new: list[_New]) -> None:
        """Persist new substitutions (and offload their originals), then show them. If the
        store fails, the view stays as it was: a placeholder must never point nowhere."""
        hint, session.next_hint = session.next_hint, None
        if not new:
            if hint is not None:
                session.trim_hint = hint
            return
        session_id = session.state.session_id
        try:
            self.store.save_substitutions(
                session_id,
                [(sub, texts) for _, sub, texts in new],
                ttl_days=self.settings.offload_ttl_days,
            )
        except RagentMemoryError as err:
            log.error("substitutions.write_failed", session_id=session_id, error=repr(err))
            session.trim_hint = None  # nothing was evicted: the next turn must look again
            return
        if hint is not None:
            session.trim_hint = hint
        for index, sub, _ in new:
            session.subs[sub.key] = sub
            view.show(index, sub.message, sub.kind, session.size_of(sub))
            if sub.kind == "truncate":
                log.info(
                    "reduce.truncated",
                    session_id=session_id,
                    original_chars=chars(view.originals[index]),
                    shown_chars=view.sizes[index],
                )

    def _run_gates(
        self, session: _Session, user_id: str | None
    ) -> tuple[list[Message], TurnReport]:
        view, chars_in = self._view(session)
        self._record(session, view, self._trim(session, view, self._reduce(session, view)))
        compacted, skipped = False, None
        if self.settings.summary_enabled:
            skipped = self._compact(session, view, user_id)
            if session.state.generation != session.returned_generation:
                compacted = True
                session.trim_hint = None  # its indexes belong to the view before the summary
                view, _ = self._view(session)
        session.returned_generation = session.state.generation
        session.tail = _Tail.of(view, len(session.raw.messages))
        raw_sizes = session.raw.sizes
        shown = Counter(view.kinds.values())
        head = view.head
        report = TurnReport(
            chars_raw=sum(raw_sizes),
            chars_in=chars_in,
            chars_out=view.total,
            trimmed=shown["trim"],
            truncated=shown["truncate"],
            # The tail differs from the caller's messages only where something is substituted.
            reclaimed_chars=sum(raw_sizes[head + view.offset :]) - sum(view.sizes[head:]),
            compacted=compacted,
            skipped_reason=skipped,
            generation=session.state.generation,
            memory_chars=0,
            duration_ms=0.0,
        )
        # Every dict handed out is a fresh shallow copy: an app that decorates what it sends
        # (cache_control, a serializer popping keys) changes neither its own history nor the
        # engine's caches. One C-level copy per message.
        return list(map(dict, view.messages)), report

    # ------------------------------------------------------------------ compaction

    def _adopt_late_compaction(self, session: _Session) -> None:
        """Apply a compaction that finished after its caller stopped waiting."""
        future = session.future
        if future is None or not future.done():
            return
        session.future = None
        try:
            state = future.result()
        except Exception as err:  # already audited by the worker when it was expected
            log.error("compaction.crashed", session_id=session.state.session_id, error=repr(err))
            return
        if state is not None:
            session.state = state

    def _check_covered(self, session: _Session, user_id: str | None) -> None:
        """Drop the summary when the caller's history no longer matches what it covers."""
        state = session.state
        if not state.generation:
            return
        raw = session.raw
        if (
            session.verified_digest == state.covered_digest
            and raw.unchanged(state.prefix_len, state.covered)
            and leading_system_count(raw.messages[: state.prefix_len + 1]) == state.prefix_len
        ):
            return  # identity fast path: the covered messages are the very dicts verified before
        reason = None
        if len(raw.messages) < state.covered:
            reason = "history_shorter"
        elif leading_system_count(raw.messages[: state.covered]) != state.prefix_len:
            reason = "prefix_changed"
        elif chain_digest(raw.digests[state.prefix_len : state.covered]) != state.covered_digest:
            reason = "history_edited"
        if reason is None:
            session.verified_digest = state.covered_digest
            return
        log.warning(
            "compaction.invalidated",
            session_id=state.session_id,
            generation=state.generation,
            reason=reason,
        )
        fresh = SessionState(
            state.session_id, user_id=user_id, last_generation=state.last_generation
        )
        try:
            self.store.save_session(fresh)
        except StoreError as err:  # the caller's history wins either way; retried on restart
            log.error("session.write_failed", session_id=state.session_id, error=repr(err))
        compact.write_audit(
            self.store,
            {
                "session_id": state.session_id,
                "user_id": user_id,
                "generation": state.generation,
                "status": "invalidated",
                "reason": reason,
                "summary": state.summary,
                "summary_chars": len(state.summary),
            },
        )
        session.state = fresh
        session.verified_digest = ""
        session.returned_generation = 0

    def _compact(self, session: _Session, view: View, user_id: str | None) -> str | None:
        """Run gate 2; returns why a due compaction did not apply, or None (applied, or not
        due because the view is under the trigger)."""
        if session.future is not None:
            return "in_progress"
        decision = compact.plan(view.messages, view.sizes, head=view.head, settings=self.settings)
        if decision == "below_trigger":
            return None  # nothing is due: not a skip
        if isinstance(decision, str):
            if decision != "last_not_user":
                log.info(
                    "compaction.skipped",
                    session_id=session.state.session_id,
                    reason=decision,
                    chars=view.total,
                )
            return decision
        raw = session.raw
        prefix_len = leading_system_count(raw.messages)
        start, stop = decision.head + view.offset, decision.cut + view.offset
        job = compact.Job(
            previous=session.state,
            user_id=user_id,
            material=tuple((i, raw.messages[i]) for i in range(start, stop)),
            prefix_len=prefix_len,
            new_covered=stop,
            covered_digest=chain_digest(raw.digests[prefix_len:stop]),
            plan=decision,
            prefix_chars=sum(view.sizes[:prefix_len]),
        )
        try:
            future = self._pool.submit(
                compact.run,
                job,
                summarizer=self.summarizer,
                store=self.store,
                settings=self.settings,
                emit=self._emit,
            )
        except RuntimeError:  # the engine is closing: its pool takes no more work
            return "closed"
        session.future = future
        try:
            state = future.result(timeout=self.settings.compaction_timeout_s)
        except FutureTimeout:
            log.warning(
                "compaction.timeout",
                session_id=session.state.session_id,
                timeout_s=self.settings.compaction_timeout_s,
            )
            return "timeout"
        except Exception as err:  # compact.run audits its own failures; this is a crash
            session.future = None
            log.error("compaction.crashed", session_id=session.state.session_id, error=repr(err))
            return "failed"
        session.future = None
        if state is None:
            return "failed"
        session.state = state
        session.verified_digest = state.covered_digest
        return None

    # ------------------------------------------------------------------ long-term memory

    def _memory_block(self, session: _Session, user_id: str | None) -> str:
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

    def _build_block(self, session: _Session, user_id: str) -> str:
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
        if self._closed:
            raise RagentMemoryError("engine is closed")
        _check_id("session_id", session_id)
        if not isinstance(messages, list | tuple):
            raise InvalidMessagesError(
                None, f"expected a list of messages, got {type(messages).__name__}"
            )
        if user_id is None or not self.settings.long_term_enabled:
            validate_messages(messages)
            return
        _check_id("user_id", user_id)
        try:
            pending = self._record_user_messages(user_id, session_id, messages)
        except StoreError as err:
            log.error("memory.record_failed", user_id=user_id, error=repr(err))
            return
        if pending >= EXTRACTION_MIN_PENDING:
            self._schedule_extraction(user_id)

    def _record_user_messages(
        self, user_id: str, session_id: str, messages: Sequence[Message]
    ) -> int:
        seen, last_digest = self.store.memory_cursor(user_id, session_id) or (0, "")
        start = 0
        if 0 < seen <= len(messages):  # the usual append-only app: read only what is new
            validate_message(messages[seen - 1], seen - 1)
            if message_digest(messages[seen - 1]) == last_digest:
                start = seen
        validate_messages(messages, start)
        items = []
        for index in range(start, len(messages)):
            message = messages[index]
            text = text_of(message).strip() if message.get("role") == "user" else ""
            if text and not text.startswith(_ENGINE_HEADERS):  # never learn from our own blocks
                items.append((index, message_digest(message), utf8(text)))
        return self.store.record_user_messages(
            user_id,
            session_id,
            items,
            seen=len(messages),
            last_digest=message_digest(messages[-1]) if messages else "",
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
            try:
                future = self._memory_pool.submit(self._extract, user_id)
            except RuntimeError:  # the engine is closing; the batch waits for the next run
                log.warning("memory.not_scheduled", user_id=user_id, reason="closed")
                return
            self._extractions[user_id] = future
        future.add_done_callback(lambda done: self._forget_future(user_id, done))

    def _forget_future(self, user_id: str, future: Future[None]) -> None:
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
        _check_id("user_id", user_id)
        return self.store.facts(user_id)

    def forget(self, user_id: str) -> None:
        """Erase everything remembered about the user: facts and summaries (whatever their
        status), their search index and pending messages. The next ``prepare`` shows no
        block; an extraction in flight finds its batch gone and writes nothing."""
        _check_id("user_id", user_id)
        forgotten = self.store.forget(user_id)
        with self._sessions_lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            cached = session.memory
            if cached is not None and cached[0] == user_id:
                session.memory = None
        log.info("memory.forgotten", user_id=user_id, **attrs.asdict(forgotten))

    # ------------------------------------------------------------------ recall and lifecycle

    def recall_tool(self) -> dict[str, Any]:
        """The OpenAI tool schema the model calls to read back an offloaded result."""
        return recall_tool_schema()

    def recall(self, session_id: str, ref: str, offset: int = 0, limit: int = DEFAULT_LIMIT) -> str:
        """``original[offset:offset + limit]`` of an offloaded original, then a footer saying
        how many chars remain. Whatever the model passed, the answer is text it can read (never
        an exception, never another session's data): an unknown, expired, dropped or
        other-session ref, or a bad offset or limit, gets a clear refusal."""
        if self._closed:
            raise RagentMemoryError("engine is closed")
        key = ref.strip() if isinstance(ref, str) else None
        original = None
        if key and isinstance(session_id, str):
            try:
                original = self.store.read_offload(session_id, key)
            except StoreError as err:
                log.error("recall.failed", session_id=session_id, ref=key, error=repr(err))
                return "[recall: the store could not be read just now; try again later]"
        return recall_slice(original, ref, offset, limit)

    def drop_session(self, session_id: str) -> None:
        """Drop a session: its summary and sticky substitutions go now, its recall refs stop
        resolving at once, and the next :meth:`gc` deletes its offloads. Audit rows stay; the
        id, used again, starts a fresh session."""
        with self._sessions_lock:
            session = self._sessions.pop(session_id, None)
        if session is not None:
            with session.lock:  # let a prepare in flight finish first
                future = session.future
            # A compaction still running cannot commit after the drop (the store refuses it as
            # stale); flush() still waits for it.
            if future is not None and wait([future], self.settings.compaction_timeout_s)[1]:
                log.warning("drop_session.compaction_still_running", session_id=session_id)
                with self._sessions_lock:
                    self._detached.append(future)
        with self._sessions_lock:  # no prepare may reload the session halfway through
            self._sessions.pop(session_id, None)
            self.store.drop_session(session_id)
        log.info("session.dropped", session_id=session_id)

    def gc(self) -> GCReport:
        """Delete expired offloads and everything left of dropped sessions; report it."""
        report = self.store.gc()
        log.info("gc.done", **attrs.asdict(report))
        return report
