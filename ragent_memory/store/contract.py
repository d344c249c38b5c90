"""The store contract: what each consumer asks of a store, one small Protocol per concern
(each naming the store module that implements it). A consumer takes the smallest one it uses,
or a union of a few, so the type checker proves what it may call. ``Backend`` is all of them
plus closing, implemented by the SQLite :class:`~ragent_memory.store.Store` and
``PostgresStore``. Value types live in :mod:`ragent_memory.core.records`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ragent_memory.core.names import MemoryKind
from ragent_memory.core.records import (
    AuditRow,
    Fact,
    Forgotten,
    GCReport,
    IndexedMessage,
    PendingMessage,
    Plan,
    SessionState,
    Substitution,
)
from ragent_memory.store.recall_index import Candidates
from ragent_memory.store.vectors import VectorRow


class SessionStore(Protocol):
    """Each session's summary state, its generations, dropping it (``sessions.py``)."""

    def new_session(self, session_id: str) -> SessionState: ...
    def load_session(self, session_id: str) -> SessionState | None: ...
    def save_session(self, state: SessionState) -> None: ...
    def commit_generation(
        self, state: SessionState, previous: SessionState, audit: AuditRow | None = None
    ) -> bool: ...
    def drop_session(self, session_id: str) -> None: ...


class OffloadRefs(Protocol):
    """Originals kept behind recall refs, and the ref naming each (``offloads.py``)."""

    def offload_all(self, session_id: str, contents: Sequence[str], *, ttl_days: float) -> None: ...
    def ref_for(self, session_id: str, content: str) -> str: ...


class OffloadStore(OffloadRefs, Protocol):
    """Sticky substitutions (``sessions.py``) and the originals behind their refs: reading
    them, their expiry and garbage collection (``offloads.py``)."""

    def substitutions(self, session_id: str) -> dict[str, Substitution]: ...
    def save_substitutions(
        self,
        session_id: str,
        items: Sequence[tuple[Substitution, Sequence[str]]],
        *,
        ttl_days: float,
    ) -> None: ...
    def delete_substitutions(self, session_id: str, keys: Sequence[str]) -> None: ...
    def read_offload(self, session_id: str, ref: str) -> str | None: ...
    def revive(self, session_id: str) -> None: ...
    def gc(self, *, vacuum: bool = False) -> GCReport: ...


class AuditLog(Protocol):
    """The append-only ``compactions`` table (``audit.py``)."""

    def audit(self, row: AuditRow) -> int: ...
    def compactions(
        self, session_id: str | None = None, *, scope: str | None = None
    ) -> list[dict[str, Any]]: ...


class MemoryStore(Protocol):
    """Long-term memory per user: pending messages, facts, summaries (``memories.py``)."""

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
    def memory_rows(
        self, user_id: str, *, kind: MemoryKind | None = None
    ) -> list[dict[str, Any]]: ...
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
    def forget_fact(self, user_id: str, fact_id: int) -> int: ...
    def forget(self, user_id: str) -> Forgotten: ...


class RecallIndex(OffloadRefs, Protocol):
    """The recall index, docs/design.md §9b (``recall_index.py``), with the originals its
    refs name."""

    def index_messages(
        self, user_id: str | None, rows: Sequence[IndexedMessage], terms: Sequence[str]
    ) -> int: ...
    def last_indexed(self, session_id: str) -> IndexedMessage | None: ...
    def recall_candidates(
        self, terms: Sequence[str], *, session_id: str, user_id: str | None
    ) -> Candidates: ...
    def indexed_at(self, session_id: str, positions: Sequence[int]) -> list[IndexedMessage]: ...
    def recall_mark(self) -> tuple[int, str]: ...
    def indexed_since(
        self, after: int, *, user_id: str | None, session_id: str, limit: int | None = None
    ) -> list[tuple[IndexedMessage, bool]]: ...
    def unowned_since(self, session_id: str, after: int) -> bool: ...
    def indexed_texts(self, ids: Sequence[int]) -> dict[int, str]: ...


class VectorIndex(RecallIndex, Protocol):
    """The recall index with dense recall's vectors (``vectors.py``)."""

    def use_vector_model(self, model: str) -> int: ...
    def unembedded(
        self, *, user_id: str | None, session_id: str, limit: int
    ) -> list[tuple[int, str]]: ...
    def store_vectors(self, model: str, vectors: Sequence[tuple[int, bytes]]) -> int: ...
    def vectors_since(
        self, after: int, *, user_id: str | None, session_id: str, model: str, limit: int = ...
    ) -> list[VectorRow]: ...
    def indexed_rows(self, ids: Sequence[int]) -> list[IndexedMessage]: ...


class LeaseStore(Protocol):
    """Compaction leases, one holder per session across hosts (``hosts.py``)."""

    def claim_compaction(self, session_id: str) -> bool: ...
    def compaction_leased(self, session_id: str) -> bool: ...
    def release_compaction(self, session_id: str) -> None: ...


class HostMeta(Protocol):
    """Which store and host this is, who wrote a session last (``hosts.py``), the store's
    scope secret and applied migrations (``base.py``)."""

    path: str
    host_id: str  # each store instance is one host

    def last_write(self, session_id: str) -> tuple[str, int] | None: ...
    def scope_secret(self) -> bytes: ...  # the proxy's scope key (serve/identity.py)
    def migrations(self) -> list[str]: ...  # names of those applied, oldest first


class TurnLog(Protocol):
    """What each prepare measured, and the sessions the store knows (``turns.py``)."""

    def record_turn(
        self, session_id: str, fields: Mapping[str, Any], user_id: str | None = None
    ) -> int: ...
    def turns(self, session_id: str) -> list[dict[str, Any]]: ...
    def session_list(self, scope: str | None = None) -> list[dict[str, Any]]: ...


class Backend(
    SessionStore,
    OffloadStore,
    AuditLog,
    MemoryStore,
    VectorIndex,
    LeaseStore,
    HostMeta,
    TurnLog,
    Protocol,
):
    """A whole store: every concern, plus closing it."""

    def close(self) -> None: ...
    def __enter__(self) -> Backend: ...
    def __exit__(self, *exc_info: object) -> None: ...
