"""Long-term memory as the engine runs it (docs/design.md §9): the block a turn shows after the system
messages, the user messages ``after_turn`` records, and one background extraction per user at
a time that turns them into facts (``ragent_memory.longterm``)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import attrs

from ragent_memory.core.chars import Message, validate_message, validate_messages
from ragent_memory.core.logs import get_logger
from ragent_memory.core.provenance import Markers
from ragent_memory.engine.background import Background
from ragent_memory.engine.compaction import SUMMARY_HEADERS
from ragent_memory.engine.session import MemoryBlock, Session
from ragent_memory.engine.session import digest as message_digest
from ragent_memory.errors import StoreError
from ragent_memory.longterm.batch import run_extraction
from ragent_memory.longterm.vocabulary import (
    EXCERPT_CANDIDATES,
    HEADERS,
    MIN_EXCERPT_ROOM,
    Extractor,
    fit_block,
    utf8,
)
from ragent_memory.recall.excerpts import HEADERS as RECALL_HEADERS
from ragent_memory.settings import EXTRACTION_MIN_PENDING, Settings
from ragent_memory.store import MemoryStore
from ragent_memory.text.terms import fts_query, search_terms

log = get_logger(__name__)

# The headers of the blocks the engine writes into a prompt: never learned from, never indexed.
ENGINE_HEADERS = (
    *HEADERS.values(),
    *SUMMARY_HEADERS.values(),
    *RECALL_HEADERS.values(),
)


def own_text(message: Message, markers: Markers | None = None) -> str:
    """The user's own words in a user message: text parts only (never a tool result), the
    harness's text (``markers``) and the engine's blocks (memory, summary, recall excerpts)
    left out — a recall block rides as a leading text part of the user's message, which is
    still learnt from; a text that starts with a block (strict alternation merges them) is
    left out whole."""
    return (markers or Markers()).user_text(message, ENGINE_HEADERS)


class LongTermMemory:
    """The engine's side of long-term memory, for every user it serves."""

    def __init__(
        self, store: MemoryStore, settings: Settings, extractor: Extractor, background: Background
    ) -> None:
        self.store, self.settings, self.extractor = store, settings, extractor
        self.markers = Markers.from_settings(settings)
        self._background = background
        self._lock = threading.Lock()
        self._extractions: dict[str, Future[Any]] = {}  # user_id → the one in flight
        self._pending_users: set[str] = set()  # users with messages recorded by this engine

    def forget(self, user_id: str) -> None:
        """Erase everything remembered about the user (``MemoryEngine.forget``)."""
        forgotten = self.store.forget(user_id)
        log.info("memory.forgotten", user_id=user_id, **attrs.asdict(forgotten))

    def forget_fact(self, user_id: str, fact_id: int) -> bool:
        """Erase one active fact and the versions it superseded (``MemoryEngine.forget_fact``)."""
        erased = self.store.forget_fact(user_id, fact_id)
        log.info("memory.fact_forgotten", user_id=user_id, fact_id=fact_id, rows=erased)
        return erased > 0

    def block(self, session: Session, user_id: str | None) -> str:
        """The user's memory block for this session ("" for none). It is built at the
        session's first ``prepare`` and again only at a compaction event (a new summary
        generation, or the summary dropped), so it never moves bytes the previous call sent:
        facts learnt mid-session wait for the next compaction. One exception: facts erased
        (``forget``, ``forget_fact``) leave the block at once. The caller holds
        ``session.lock``."""
        if not user_id or not self.settings.long_term_enabled:
            return ""
        try:
            version = self.store.memory_version(user_id)
            kept = session.memory
            if kept is not None and (kept.user_id, kept.generation) == (
                user_id,
                session.state.generation,
            ):
                if kept.version == version:
                    return kept.text
                if version and not self._erased(user_id, kept.fact_ids):
                    session.memory = attrs.evolve(kept, version=version)
                    return kept.text
            built = self._build(session, user_id) if version else ("", ())
        except StoreError as err:  # memory is background: a store failure must not break a turn
            log.error("memory.read_failed", user_id=user_id, error=repr(err))
            return ""
        session.memory = MemoryBlock(user_id, version, session.state.generation, *built)
        return built[0]

    def _erased(self, user_id: str, fact_ids: Sequence[int]) -> bool:
        """Whether a fact the block shows was erased since (its row is gone)."""
        if not fact_ids:
            return False
        rows = {row["id"] for row in self.store.memory_rows(user_id, kind="fact")}
        return not set(fact_ids) <= rows

    def _build(self, session: Session, user_id: str) -> tuple[str, tuple[int, ...]]:
        """The user's facts, then excerpts of their other sessions' summaries matching the
        latest words of the user while there is room; with the ids of the facts."""
        language, cap = self.settings.language, self.settings.memory_max_chars
        stored = self.store.facts(user_id)
        facts = [f.content for f in stored]
        ids = tuple(f.id for f in stored)
        block = fit_block(facts, (), language=language, max_chars=cap)
        if cap - len(block) < MIN_EXCERPT_ROOM:
            return block, ids
        latest = next(
            (
                text
                for m in reversed(session.raw.messages)
                if (text := self.markers.user_text(m, ENGINE_HEADERS))
            ),
            "",
        )
        terms = search_terms(latest)
        if not terms:
            return block, ids
        excerpts = self.store.search_summaries(
            user_id,
            fts_query(terms),
            exclude_session=session.state.session_id,
            limit=EXCERPT_CANDIDATES,
        )
        return fit_block(facts, excerpts, language=language, max_chars=cap), ids

    def record(self, user_id: str, session_id: str, messages: Sequence[Message]) -> bool:
        """Record the user's messages not recorded before (validating what is new) and, with
        enough pending, start an extraction. False when the store failed (logged)."""
        try:
            pending = self._record(user_id, session_id, messages)
        except StoreError as err:
            log.error("memory.record_failed", user_id=user_id, error=repr(err))
            return False
        with self._lock:
            self._pending_users.add(user_id)
        if pending >= EXTRACTION_MIN_PENDING:
            self.schedule(user_id)
        return True

    def _record(self, user_id: str, session_id: str, messages: Sequence[Message]) -> int:
        """Record what the store's cursor for the session has not seen (an appending app's
        new messages; all of a rebuilt history); returns how many are pending."""
        seen, last_digest = self.store.memory_cursor(user_id, session_id) or (0, "")
        start = 0
        if 0 < seen <= len(messages):
            validate_message(messages[seen - 1], seen - 1)
            if message_digest(messages[seen - 1], seen - 1) == last_digest:
                start = seen
        validate_messages(messages, start)
        items = []
        for index in range(start, len(messages)):
            message = messages[index]
            text = own_text(message, self.markers)
            if text:
                items.append((index, message_digest(message, index), utf8(text)))
        return self.store.record_user_messages(
            user_id,
            session_id,
            items,
            seen=len(messages),
            last_digest=message_digest(messages[-1], len(messages) - 1) if messages else "",
        )

    def schedule(self, user_id: str) -> None:
        """A background extraction for the user, unless one is in flight."""
        with self._lock:
            running = self._extractions.get(user_id)
            if running is not None and not running.done():
                return
            future = self._background.submit_extraction(self._extract, user_id)
            if future is None:  # the engine is closing; the batch waits for the next run
                log.warning("memory.not_scheduled", user_id=user_id, reason="closed")
                return
            self._extractions[user_id] = future
        future.add_done_callback(lambda done: self._finished(user_id, done))

    def schedule_pending(self) -> None:
        """An extraction for every user this engine recorded messages of since the last call,
        however few are pending (``flush(extract_pending=True)``)."""
        with self._lock:
            users = sorted(self._pending_users)
            self._pending_users.clear()
        for user_id in users:
            self.schedule(user_id)

    def _finished(self, user_id: str, future: Future[Any]) -> None:
        with self._lock:
            if self._extractions.get(user_id) is future:
                del self._extractions[user_id]

    def _extract(self, user_id: str) -> None:
        try:
            run_extraction(self.store, self.extractor, user_id, settings=self.settings)
        except Exception as err:  # the worker boundary: log a crash, keep the pool alive
            log.error("memory.crashed", user_id=user_id, error=repr(err))
