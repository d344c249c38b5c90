"""What the engine keeps per session id, each table bounded by ``session_cache_size``: the
sessions in memory (``Sessions``) and the plain histories ``after_turn`` last validated
(``Validated``)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import wait
from contextlib import contextmanager
from typing import Any, Protocol

from ragent_memory.core.chars import Message
from ragent_memory.core.logs import get_logger
from ragent_memory.core.lru import LRU
from ragent_memory.engine.session import Services, Session
from ragent_memory.store import HostMeta, OffloadStore, SessionStore

log = get_logger(__name__)


class SessionsStore(SessionStore, OffloadStore, HostMeta, Protocol):
    """What loading a session asks: who wrote it last, its state and substitutions."""


class Sessions:
    """The sessions in memory, least recently used first. A call holds a session between
    ``checkout`` and ``release`` (``held``); idle sessions over ``size`` are evicted (the
    store keeps everything they knew)."""

    def __init__(self, store: SessionsStore, services: Services, size: int) -> None:
        self._store, self._services, self._size = store, services, size
        # Re-entrant, so a caller may hold it across a lookup (``drop_session``).
        self.lock = threading.RLock()
        self._table: OrderedDict[str, Session] = OrderedDict()

    def get(self, session_id: str) -> Session | None:
        with self.lock:
            return self._table.get(session_id)

    def __getitem__(self, session_id: str) -> Session:
        with self.lock:
            return self._table[session_id]

    def __len__(self) -> int:
        with self.lock:
            return len(self._table)

    def may_wait(self, session_id: str, messages: Sequence[Message]) -> bool:
        """Whether a turn of ``messages`` could wait on a compaction of the session: False
        only when it is in memory, ``Session.may_wait`` says it cannot, and no other host
        moved it on (``prepare`` would reload it then)."""
        session = self.get(session_id)
        if session is None or session.may_wait(messages):
            return True
        written = self._store.last_write(session_id)
        return written not in (None, session.last_write) and written[0] != self._store.host_id

    def pop(self, session_id: str) -> Session | None:
        with self.lock:
            return self._table.pop(session_id, None)

    def drop(self, session_id: str, timeout_s: float) -> None:
        """Take the session out of memory once a call in flight on it is done, waiting at
        most ``timeout_s`` for its compaction in flight: that one cannot commit after the
        drop (the store refuses it as stale), and ``flush`` still waits for it."""
        session = self.pop(session_id)
        if session is None:
            return
        with session.lock:
            future = session.future
        if future is not None and wait([future], timeout_s)[1]:
            log.warning("drop_session.compaction_still_running", session_id=session_id)

    @contextmanager
    def held(self, session_id: str) -> Iterator[Session]:
        session = self.checkout(session_id)
        try:
            yield session
        finally:
            self.release(session)

    def checkout(self, session_id: str) -> Session:
        """The session, loaded from the store when it is not in memory or another host moved
        it on since it was loaded; counted as held until ``release``."""
        store = self._store
        written = store.last_write(session_id)
        with self.lock:
            session = self._table.get(session_id)
            if (
                session is not None
                and written is not None
                and written[0] != store.host_id
                and written != session.last_write
                and (session.future is None or session.future.done())
            ):
                session = None  # another host moved the session on: continue from the store
            if session is None:
                # A dropped id used again starts a new life; a late compaction of the old
                # life (still marked dropped until now) could not commit meanwhile.
                store.revive(session_id)
                state = store.load_session(session_id) or store.new_session(session_id)
                session = Session(state, store.substitutions(session_id), self._services)
                session.last_write = written
                self._table[session_id] = session
            self._table.move_to_end(session_id)
            session.callers += 1
            return session

    def release(self, session: Session) -> None:
        """A call is done with ``session``; evict idle sessions over the size."""
        with self.lock:
            session.callers -= 1
            excess = len(self._table) - self._size
            if excess <= 0:
                return
            for session_id in list(self._table)[:excess]:
                if self._table[session_id].is_idle():
                    del self._table[session_id]


class Validated:
    """Per session, a copy of the plain messages the last ``after_turn`` validated, so the
    next call of an app that appends converts and validates only its new messages (O(new)
    Python work a turn instead of O(history))."""

    def __init__(self, size: int) -> None:
        self._lock = threading.Lock()
        self._table: LRU[str, list[Message]] = LRU(size)

    def pop(self, session_id: str) -> None:
        with self._lock:
            self._table.pop(session_id, None)

    def seen(self, session_id: str, messages: Sequence[Message]) -> int:
        """How many leading ``messages`` are (equal to) the ones kept for the session."""
        with self._lock:
            kept = self._table.peek(session_id)
        if not kept or not isinstance(messages, list) or len(messages) < len(kept):
            return 0
        try:
            return len(kept) if messages[: len(kept)] == kept else 0
        except Exception:  # a value whose == raises: read everything, validation names it
            return 0

    def keep(self, session_id: str, given: Any, accepted: Sequence[Message]) -> None:
        """Keep what a successful ``after_turn`` was given, when it was plain chat dicts."""
        if accepted is not given or not isinstance(given, list):
            return
        with self._lock:
            self._table.put(session_id, list(given))
