"""Value types the store and the domain modules share: a bottom module, importing only ``names``.

The store speaks in these (session state, substitutions, pending messages, facts, a memory
batch's plan, an audit row); ``longterm`` plans with ``Fact``/``Draft``/``Plan`` and the engine
reads them.
"""

from __future__ import annotations

from typing import Any

import attrs

from ragent_memory.core.names import (
    AuditReason,
    AuditStatus,
    ErrorName,
    SubstitutionKind,
    WrittenBy,
)


@attrs.frozen
class SessionState:
    """What a session's compactions left behind; resumed by any engine on the same store."""

    session_id: str
    user_id: str | None = None
    generation: int = 0  # the current summary's generation; 0 = no summary
    last_generation: int = 0  # the highest generation ever applied (numbers never repeat)
    summary: str = ""  # as shown to the model: body plus the verbatim user requests
    body: str = ""  # as written by the summarizer; the next generation rewrites it
    prefix_len: int = 0
    covered: int = 0
    covered_digest: str = ""
    verbatim: tuple[dict[str, Any], ...] = ()
    preserved: tuple[dict[str, Any], ...] = ()  # latest result of each preserved tool


@attrs.frozen
class IndexedMessage:
    """One message of the recall index (docs/design.md §9b)."""

    session_id: str
    position: int  # index in the session's history
    role: str  # a ``Role`` of an indexed message (``recall.index.INDEXED_ROLES``)
    content: str
    dated: str = ""  # the date stamp in force where it was said ("" for none)
    digest: str = ""
    id: int = 0  # the row id (order of indexing); 0 before it is stored
    score: float = 0.0  # BM25 of a search hit (lower is better); 0 otherwise


def substitution_key(position: int, digest: str) -> str:
    return f"{position}:{digest}"


@attrs.frozen
class Substitution:
    """A sticky replacement of one original message in the view. ``key`` (see
    :func:`substitution_key`) is the position after the leading system messages plus the content
    digest: the same content at another position (a repeated search) is not substituted."""

    key: str
    kind: SubstitutionKind  # "recall": a turn's recall block on its user message
    ref: str
    message: dict[str, Any]


@attrs.frozen(kw_only=True)
class AuditRow:
    """One row of the append-only ``compactions`` table (docs/design.md §10), as a compaction,
    a failure or an invalidation writes it. Every column is written; the defaults are the
    table's own, so a row says only what it knows. ``id`` and ``created_at`` are the store's;
    the fields are in the table's column order."""

    session_id: str
    user_id: str | None = None
    generation: int
    status: AuditStatus
    reason: AuditReason | ErrorName | None = None
    model: str | None = None
    attempts: int = 0
    material_messages: int = 0
    material_chars: int = 0
    summary_chars: int = 0
    chars_before: int = 0
    chars_after: int = 0
    duration_ms: int = 0
    summary: str | None = None
    error: str | None = None
    # created_at: stamped by the store
    identifiers_kept: int = 0
    identifiers_lost: int = 0
    written_by: WrittenBy = ""
    covered_from: int = 0  # the raw indexes [from, to) the compaction summarized
    covered_to: int = 0


@attrs.frozen
class PendingMessage:
    """A user message waiting for fact extraction."""

    id: int
    session_id: str
    raw_index: int
    content: str
    attempts: int


@attrs.frozen
class Forgotten:
    """What one :meth:`Store.forget` erased."""

    memories: int = 0
    pending: int = 0


@attrs.frozen
class GCReport:
    """What one :meth:`Store.gc` deleted, and what the database file shrank by."""

    expired_offloads: int = 0
    dropped_sessions: int = 0
    dropped_offloads: int = 0  # offloads of those sessions (expired or not)
    freed_bytes: int = 0  # UTF-8 bytes of the deleted originals
    # The file on disk before and after (0 for ``:memory:``); not compared, they vary by page.
    file_bytes_before: int = attrs.field(default=0, eq=False)
    file_bytes_after: int = attrs.field(default=0, eq=False)


@attrs.frozen
class Fact:
    """One active fact about a user, as stored."""

    id: int
    content: str
    created_at: str = ""


@attrs.frozen
class Draft:
    """A fact while a batch is planned: a stored one (``key`` = its id) or a new one (< 0)."""

    key: int
    content: str
    order: int  # age: stored facts by id, new ones after every stored one
    is_touched: bool = False  # added or superseded by this batch (or merged from such)
    replaces: frozenset[int] = frozenset()  # stored facts a new draft stands for

    @property
    def sources(self) -> frozenset[int]:
        """The stored facts this draft carries."""
        return (self.replaces | {self.key}) if self.key > 0 else self.replaces


@attrs.frozen
class Plan:
    """What one batch writes: the active facts after it and the facts it ends."""

    drafts: tuple[Draft, ...]  # oldest first
    retracted: frozenset[int]
    evicted: frozenset[int]
    added: int
    superseded: int
    merged: int  # drafts folded into others by consolidation
    chars_before: int  # the block (facts only) before consolidation
    chars_consolidated: int  # after consolidation, before eviction
    chars: int  # after the whole plan
    is_consolidated: bool

    @property
    def new(self) -> tuple[Draft, ...]:
        return tuple(d for d in self.drafts if d.key < 0)

    @property
    def is_change(self) -> bool:
        return bool(self.new or self.retracted or self.evicted)
