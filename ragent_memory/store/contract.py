"""The store contract: what the engine, compaction and long-term memory ask of a store.

One protocol per concern, each small enough to read at a glance, and ``Backend`` for all of
them: the SQLite :class:`~ragent_memory.store.Store` and the PostgreSQL ``PostgresStore``
implement it. The value types it speaks in live in :mod:`ragent_memory.core.records`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ragent_memory.core.records import (
    Fact,
    Forgotten,
    GCReport,
    IndexedMessage,
    PendingMessage,
    Plan,
    SessionState,
    Substitution,
)


class Sessions(Protocol):
    """Per-session summary state and sticky substitutions (``sessions.py``)."""

    def new_session(self, session_id: str) -> SessionState: ...

    def load_session(self, session_id: str) -> SessionState | None: ...

    def save_session(self, state: SessionState) -> None: ...

    def commit_generation(
        self, state: SessionState, previous: SessionState, audit: dict[str, Any] | None = None
    ) -> bool: ...

    def substitutions(self, session_id: str) -> dict[str, Substitution]: ...

    def save_substitutions(
        self,
        session_id: str,
        items: Sequence[tuple[Substitution, Sequence[str]]],
        *,
        ttl_days: float,
    ) -> None: ...

    def drop_session(self, session_id: str) -> None: ...


class Offloads(Protocol):
    """Originals behind recall refs, their expiry and garbage collection (``offloads.py``)."""

    def ref_for(self, session_id: str, content: str) -> str: ...

    def read_offload(self, session_id: str, ref: str) -> str | None: ...

    def revive(self, session_id: str) -> None: ...

    def gc(self, *, vacuum: bool = False) -> GCReport: ...


class Memories(Protocol):
    """Long-term memory per user and its search index (``memories.py``)."""

    def memory_version(self, user_id: str) -> int: ...

    def memory_cursor(self, user_id: str, session_id: str) -> tuple[int, str] | None: ...

    def record_user_messages(
        self,
        user_id: str,
        session_id: str,
        items: Sequence[tuple[int, str, str]],
        *,
        seen: int,
        last_digest: str,
    ) -> int: ...

    def pending_messages(self, user_id: str, *, limit: int) -> list[PendingMessage]: ...

    def fail_pending(self, user_id: str, ids: Sequence[int], *, max_attempts: int) -> int: ...

    def facts(self, user_id: str) -> list[Fact]: ...

    def memory_rows(self, user_id: str, *, kind: str | None = None) -> list[dict[str, Any]]: ...

    def commit_memories(
        self, user_id: str, pending_ids: Sequence[int], plan: Plan, *, session_id: str
    ) -> None: ...

    def record_summary(
        self,
        user_id: str,
        session_id: str,
        generation: int,
        summary: str,
        excerpts: Sequence[tuple[str, str]],
    ) -> int: ...

    def search_summaries(
        self, user_id: str, query: str, *, exclude_session: str, limit: int
    ) -> list[str]: ...

    def forget(self, user_id: str) -> Forgotten: ...


class RecallIndex(Protocol):
    """The recall index, DESIGN §9b (``recall_index.py``; PostgreSQL ranks its own search in
    ``postgres.py``)."""

    def index_messages(
        self, user_id: str | None, rows: Sequence[IndexedMessage], terms: Sequence[str]
    ) -> int: ...

    def last_indexed(self, session_id: str) -> IndexedMessage | None: ...

    def search_index(
        self,
        query: str,
        *,
        session_id: str,
        user_id: str | None,
        visible_from: int,
        shown: Sequence[int] = (),
        limit: int,
    ) -> list[IndexedMessage]: ...

    def indexed_at(self, session_id: str, positions: Sequence[int]) -> list[IndexedMessage]: ...

    def recall_mark(self) -> tuple[int, str]: ...

    def indexed_since(
        self, after: int, *, user_id: str | None, session_id: str
    ) -> list[tuple[IndexedMessage, bool]]: ...

    def unowned_since(self, session_id: str, after: int) -> bool: ...

    def indexed_texts(self, ids: Sequence[int]) -> dict[int, str]: ...

    def offload(self, session_id: str, content: str, *, ttl_days: float) -> str: ...

    def offload_all(self, session_id: str, contents: Sequence[str], *, ttl_days: float) -> None: ...

    def ref_for(self, session_id: str, content: str) -> str: ...


class Audit(Protocol):
    """The append-only ``compactions`` table (``audit.py``)."""

    def audit(self, row: dict[str, Any]) -> int: ...

    def compactions(self, session_id: str | None = None) -> list[dict[str, Any]]: ...


class Hosts(Protocol):
    """Many hosts on one store: compaction leases and who wrote a session last (``hosts.py``).
    Each store instance is one host, ``host_id``."""

    host_id: str

    def claim_compaction(self, session_id: str) -> bool: ...

    def release_compaction(self, session_id: str) -> None: ...

    def last_write(self, session_id: str) -> tuple[str, int] | None: ...


class Backend(Sessions, Offloads, Memories, RecallIndex, Audit, Hosts, Protocol):
    """A whole store: every concern, plus closing it."""

    path: str

    def migrations(self) -> list[str]:
        """The names of the schema migrations applied, oldest first."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Backend: ...

    def __exit__(self, *exc_info: object) -> None: ...
