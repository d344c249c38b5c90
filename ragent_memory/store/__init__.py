"""The store (docs/design.md §10), split by what it keeps; every engine on it shares what it holds.

Each concern is a mixin in its own module and a small Protocol in ``contract`` (``Backend`` is
all of them); ``schema`` holds the columns and migrations. Two backends compose them:
``sqlite`` (the :class:`Store`) and ``postgres`` (``PostgresStore``, schema in ``pg_schema``);
``open_store`` picks one from the settings. Value types are in :mod:`ragent_memory.core.records`.

Tables not described where they are used:

- ``ids``: each session and user id once, under its 16-byte key (``base.id_key``); every other
  table and index holds the key, the ``compactions`` audit aside (it keeps the text).

- ``substitutions``: sticky per-message replacements, keyed by the message's position plus its
  content digest (column ``key``), so a prompt prefix stays byte-stable across turns.
- ``dropped_sessions``: sessions the app dropped; their refs stop resolving at once and the next
  :meth:`Store.gc` deletes their offloads.
- ``meta``: the store's secret (recall refs are HMACs under it) and ``memory_seq``, the counter
  long-term memory versions are drawn from.
- ``memories``: facts and copies of applied compaction summaries, each ``active``,
  ``superseded`` (``superseded_by`` links the replacement), ``retracted`` or ``evicted``; only
  ``forget`` deletes rows. ``memory_fts`` indexes the excerpts of active summaries.
- ``memory_cursors`` / ``memory_seen``: how far each session's history was read, and digests
  (no text) of the user messages already recorded, so ``after_turn`` is idempotent.
"""

from ragent_memory.core.records import (
    AuditRow,
    GCReport,
    SessionState,
    Substitution,
    substitution_key,
)
from ragent_memory.errors import StoreError
from ragent_memory.settings import StoreSettings
from ragent_memory.store.base import Clock, id_key, iso, utc_now
from ragent_memory.store.contract import (
    AuditLog,
    Backend,
    HostMeta,
    LeaseStore,
    MemoryStore,
    OffloadRefs,
    OffloadStore,
    RecallIndex,
    SessionStore,
    TurnLog,
    VectorIndex,
)
from ragent_memory.store.recall_index import Candidates
from ragent_memory.store.schema import COMPACTION_COLUMNS, MIGRATIONS
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
    "MIGRATIONS",
    "AuditLog",
    "AuditRow",
    "Backend",
    "Candidates",
    "Clock",
    "GCReport",
    "HostMeta",
    "LeaseStore",
    "MemoryStore",
    "OffloadRefs",
    "OffloadStore",
    "RecallIndex",
    "SessionState",
    "SessionStore",
    "Store",
    "Substitution",
    "TurnLog",
    "VectorIndex",
    "id_key",
    "iso",
    "open_store",
    "substitution_key",
    "utc_now",
]
