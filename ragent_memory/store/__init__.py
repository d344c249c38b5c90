"""The store (DESIGN §10), split by what it keeps; every engine on it shares what it holds.

Where each concern lives: ``contract`` (the typed protocols), ``sessions`` (summary state,
substitutions, drop), ``offloads`` (recall originals, gc), ``memories`` (long-term memory and
its search index), ``audit`` (``compactions``), ``hosts`` (compaction leases, who wrote a
session last), ``schema`` (columns and migrations). Two backends compose them: ``sqlite`` (the
:class:`Store`) and ``postgres`` (``PostgresStore``, schema in ``pg_schema``); ``open_store``
picks one from the settings. Value types are in :mod:`ragent_memory.core.records`.

Tables:

- ``compactions``: the append-only audit, one row per compaction attempt (and invalidation).
- ``sessions``: per-session summary state (generation, summary, covered pointer, verbatim list).
- ``substitutions``: sticky per-message replacements (trim placeholders, truncation previews),
  keyed by the message's position plus its content digest (column ``key``), so a prompt
  prefix stays byte-stable across turns.
- ``offloads``: originals of trimmed/truncated tool results, content-addressed per session;
  they expire after ``offload_ttl_days`` and :meth:`Store.gc` deletes them.
- ``dropped_sessions``: sessions the app dropped; their refs stop resolving at once and the next
  :meth:`Store.gc` deletes their offloads.
- ``meta``: the store's secret (recall refs are HMACs under it, so they are unguessable) and
  ``memory_seq``, the counter long-term memory versions are drawn from.
- ``memories``: long-term memory, per user: facts and copies of applied compaction summaries,
  each ``active``, ``superseded`` (``superseded_by`` links the replacement), ``retracted`` or
  ``evicted``; only ``forget`` deletes rows. ``memory_fts`` indexes the excerpts of active
  summaries (FTS5, rowid = memory id × 1024 + excerpt number).
- ``memory_pending``: user messages waiting for fact extraction, with their failed attempts.
- ``memory_cursors`` / ``memory_seen``: how far each session's history was read, and digests
  (no text) of the user messages already recorded, so ``after_turn`` is idempotent.
- ``memory_versions``: per user, bumped on every memory change (cached blocks compare it).
- ``compaction_leases`` / ``session_writes``: which host may compact a session now, and which
  host wrote it last (many hosts, ``hosts.py``).
- ``recall_messages`` / ``recall_fts``: the recall index (DESIGN §9b), see ``recall_index``.
"""

from ragent_memory.core.records import (
    Forgotten,
    GCReport,
    PendingMessage,
    SessionState,
    Substitution,
    substitution_key,
)
from ragent_memory.errors import StoreError
from ragent_memory.settings import StoreSettings
from ragent_memory.store.base import Clock, iso, utc_now
from ragent_memory.store.contract import (
    Audit,
    Backend,
    Hosts,
    Memories,
    Offloads,
    RecallIndex,
    Sessions,
)
from ragent_memory.store.schema import COMPACTION_COLUMNS, FTS_ROWS_PER_MEMORY, MIGRATIONS
from ragent_memory.store.sqlite import Store


def open_store(settings: StoreSettings, *, clock: Clock = utc_now) -> Backend:
    """The store ``settings`` name: SQLite at ``store.path``, or PostgreSQL at ``store.url``."""
    if settings.url is None:
        return Store(settings.path, clock=clock, lease_s=settings.lease_s)
    try:
        from ragent_memory.store.postgres import PostgresStore
    except ImportError as err:
        raise StoreError(
            f"store.url needs the PostgreSQL driver: pip install 'ragent-memory[postgres]' ({err})"
        ) from err
    return PostgresStore(
        settings.url,
        password=settings.password(),
        clock=clock,
        pool_size=settings.pool_size,
        lease_s=settings.lease_s,
    )


__all__ = [
    "COMPACTION_COLUMNS",
    "FTS_ROWS_PER_MEMORY",
    "MIGRATIONS",
    "Audit",
    "Backend",
    "Clock",
    "Forgotten",
    "GCReport",
    "Hosts",
    "Memories",
    "Offloads",
    "PendingMessage",
    "RecallIndex",
    "SessionState",
    "Sessions",
    "Store",
    "Substitution",
    "iso",
    "open_store",
    "substitution_key",
    "utc_now",
]
