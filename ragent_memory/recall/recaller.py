"""What the engine uses of recall (docs/design.md §9b): the indexer, the turn's block, model-driven
search (``search_memory``) and the full texts its refs name, bound to one store.

Every ref a block or a search answer shows is readable when it is handed out: the full texts
of the excerpts it clipped are written, in one transaction, before it is returned (a write
that fails shows no block: recall is help, never a reason to fail a turn).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from types import MappingProxyType
from typing import Any, Final

from ragent_memory.core import tracing
from ragent_memory.core.chars import Message
from ragent_memory.core.logs import get_logger
from ragent_memory.core.lru import LRU
from ragent_memory.core.memo import Memo
from ragent_memory.core.provenance import Markers
from ragent_memory.core.records import IndexedMessage
from ragent_memory.errors import StoreError
from ragent_memory.recall.dense import DenseRecall
from ragent_memory.recall.excerpts import (
    HEADERS,
    HOP_HITS,
    NEIGHBOUR_CHARS,
    NEIGHBOURS,
    Ask,
    Recalled,
    find_block,
    fold,
    within,
)
from ragent_memory.recall.index import Indexer
from ragent_memory.recall.parts import Parts
from ragent_memory.recall.rank import RecallMirror
from ragent_memory.recall.refs import integer, tool_schema
from ragent_memory.settings import Settings
from ragent_memory.store import OffloadRefs, VectorIndex

log = get_logger(__name__)

SEARCH_TOOL_NAME: Final = "search_memory"
DEFAULT_SEARCH_LIMIT: Final = 5
OFFLOAD_REFRESH_S: Final = 3_600.0  # an excerpt's full text stored this recently is not rewritten
OFFLOADS_REMEMBERED: Final = 65_536  # (session, text) pairs remembered for that
SENTENCE_CACHE_CHARS: Final = 8_000_000  # long texts kept split and stemmed, by their length
CUT_CHARS: Final = 8_000_000  # long texts' cuts for a query's words kept, by text + cut
KNOWN_CHARS: Final = 4_000_000  # summaries kept folded (a turn would fold its own again)
HELD_CHARS: Final = 16_000_000  # whether a summary holds a hit, by the chars of both
DENSE_KEYS: Final = (
    "vectors",
    "vectors_bytes",
    "vectors_left_out",
    "embed_calls",
    "embed_failures",
)
EMPTY_SEARCH: Final = MappingProxyType(
    {
        "en": "[search_memory: nothing found for this query]",
        "zh": "[search_memory：没有找到相关内容]",
    }
)


def search_tool_schema() -> dict[str, Any]:
    """The OpenAI tool schema of ``search_memory(query, limit=5)``."""
    return tool_schema(
        SEARCH_TOOL_NAME,
        "Search earlier conversation with this user (this session's turns that are no longer "
        "shown, and the user's other sessions) for a topic, name or fact. Returns excerpts, "
        "each tagged with its session and date.",
        ["query"],
        query={"type": "string", "description": "Words to look for."},
        limit=integer(1, DEFAULT_SEARCH_LIMIT, "How many excerpts to return at most.", maximum=20),
    )


def _asked(ask: Ask) -> dict[str, Any]:
    """A search's span attributes (its size, not its words: they are the user's)."""
    return {
        "ragent_memory.session_id": ask.session_id,
        "ragent_memory.query_chars": len(ask.text),
        "ragent_memory.max_chars": ask.max_chars,
    }


def _found(found: Recalled) -> dict[str, Any]:
    return {
        "ragent_memory.excerpts": found.excerpts,
        "ragent_memory.recalled_chars": len(found.text),
    }


class Offloads:
    """The full texts of clipped excerpts, kept readable from a session by their refs. The
    same hits come back turn after turn: a text stored from a session within the refresh
    interval (which keeps it well inside its TTL) is not written again, so most turns write
    nothing. Bounded (least recently written out first), thread-safe."""

    def __init__(
        self, store: OffloadRefs, ttl_days: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.ttl_days = ttl_days
        self.clock = clock  # seconds, only ever compared with itself
        self.fresh_s = min(OFFLOAD_REFRESH_S, ttl_days * 86_400 / 2)
        self._lock = threading.Lock()
        # (session, digest) → (the text's ref, when it was written here; -inf: not yet)
        self._written: LRU[tuple[str, str], tuple[str, float]] = LRU(OFFLOADS_REMEMBERED)

    def ref(self, session_id: str, message: IndexedMessage) -> str:
        """The ref that names ``message``'s full text from ``session_id``."""
        key = (session_id, message.digest)
        with self._lock:
            known = self._written.peek(key) if message.digest else None
        if known is not None:
            return known[0]
        ref = self.store.ref_for(session_id, message.content)
        self._remember(key, (ref, -math.inf))
        return ref

    def write(self, session_id: str, messages: Sequence[IndexedMessage]) -> None:
        """Store the full texts of ``messages`` for ``session_id``, those not written
        recently, in one transaction; raises ``StoreError``."""
        now = self.clock()
        with self._lock:
            stale = {m.content: m for m in messages if not self._fresh(session_id, m, now)}
        if not stale:
            return
        self.store.offload_all(session_id, list(stale), ttl_days=self.ttl_days)
        for message in stale.values():
            self._remember((session_id, message.digest), (self.ref(session_id, message), now))

    def _fresh(self, session_id: str, message: IndexedMessage, now: float) -> bool:
        known = self._written.peek((session_id, message.digest)) if message.digest else None
        return known is not None and now - known[1] < self.fresh_s

    def _remember(self, key: tuple[str, str], entry: tuple[str, float]) -> None:
        if not key[1]:
            return  # a text without a digest is not remembered
        with self._lock:
            self._written.put(key, entry)

    def forget(self, session_id: str) -> None:
        """A dropped session's offloads go with it: store them again when shown again."""
        with self._lock:
            for key in [key for key in self._written if key[0] == session_id]:
                self._written.pop(key)


class Recaller:
    """Recall for one engine: the indexer, the per-turn block and model-driven search."""

    def __init__(self, store: VectorIndex, settings: Settings, *, engine_headers: Sequence[str]):
        self.store = store
        self.settings = settings
        cap, embeddings = settings.recall_memory_mb * 1_000_000, settings.recall.embeddings
        # With dense recall its vectors take half of recall_memory_mb, the mirror the rest.
        self.dense = None
        if embeddings is not None:
            self.dense = DenseRecall(store, embeddings, max_bytes=cap // 2)
            cap -= cap // 2
        self.mirror = RecallMirror(store, neighbours=NEIGHBOURS, max_bytes=cap, hop=HOP_HITS)
        headers = (*engine_headers, *HEADERS.values())
        self.indexer = Indexer(
            store,
            engine_headers=headers,
            markers=Markers.from_settings(settings),
            mirror=self.mirror,
            on_left=self._ready,
            on_written=self.dense.schedule if self.dense is not None else None,
        )
        self.offloads = Offloads(store, settings.offload_ttl_days)
        # the same long hits come back turn after turn: each split into parts and stemmed once, and cut
        # once for the query words it holds
        self.sentences = Memo(Parts.of, SENTENCE_CACHE_CHARS, len)
        self.cuts = Memo(self._cut, CUT_CHARS, lambda key: len(key[0]) + key[1])
        self.folded = Memo(fold, KNOWN_CHARS, len)
        self.held: Memo[tuple[str, str], bool] = Memo(
            lambda key: within(*key), HELD_CHARS, lambda key: len(key[0]) + len(key[1])
        )

    def _cut(self, key: tuple[str, int, frozenset[str]]) -> str | None:
        text, limit, stems = key
        return self.sentences(text).cut(limit, stems)

    def _ready(self, rows: Sequence[IndexedMessage]) -> None:
        """On the indexer's thread, as rows leave a view (what recall can now show): each
        long one split and stemmed, and its ref in its own session found, ahead of the
        turn that first shows it."""
        try:
            for row in rows:
                if len(row.content) > NEIGHBOUR_CHARS:
                    self.sentences(row.content)
                    self.offloads.ref(row.session_id, row)
        except Exception as err:  # the worker boundary: it only readies later turns
            log.error("recall.ready_failed", error=repr(err))

    def on_leave(
        self, session_id: str, user_id: str | None, items: Sequence[tuple[int, Message]]
    ) -> None:
        self.indexer.add(session_id, user_id, items)

    def after_turn(
        self, messages: Sequence[Message], *, session_id: str, user_id: str | None
    ) -> None:
        self.indexer.schedule(messages, session_id=session_id, user_id=user_id)

    def _find(self, ask: Ask) -> Recalled:
        """The block for ``ask``, its refs readable (raises ``StoreError``)."""
        known = self.folded(ask.known_text)
        found = find_block(
            self.store,
            ask,
            mirror=self.mirror,
            ref_for=lambda message: self.offloads.ref(ask.session_id, message),
            cutting=(self.sentences, self.cuts),
            known=lambda text: bool(known) and self.held((text, known)),
            fuse=self.dense.fuse if self.dense is not None else None,
        )
        self.offloads.write(ask.session_id, found.referred)
        return found

    def block(
        self,
        session_id: str,
        user_id: str | None,
        query: str,
        *,
        visible_from: int,
        shown: Iterable[int],
        max_chars: int,
        known_text: str,
    ) -> Recalled:
        """The turn's recall block; a store failure logs and recalls nothing."""
        self.indexer.wait_for(session_id, visible_from, self.settings.compaction_timeout_s)
        language, shown = self.settings.language, frozenset(shown)
        ask = Ask(query, session_id, user_id, max_chars, language, visible_from, shown, known_text)
        with tracing.span("ragent_memory.recall", _asked(ask)) as span:
            try:
                found = self._find(ask)
            except StoreError as err:  # recall is help, never a reason to fail a turn
                log.error("recall.failed", session_id=session_id, error=repr(err))
                return Recalled()
            tracing.annotate(span, _found(found))
            return found

    def search(self, session_id: str, query: str, user_id: str | None, limit: Any) -> str:
        """Model-driven search: text the model reads, never an exception."""
        language = self.settings.language
        if not isinstance(query, str) or not query.strip():
            return f"[{SEARCH_TOOL_NAME}: query must be a non-empty string]"
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            return f"[{SEARCH_TOOL_NAME}: limit must be an integer ≥ 1, got {limit!r}]"
        room = self.settings.recall_floor_chars  # a tool result: a bounded answer
        ask = Ask(query, session_id, user_id, room, language, limit=limit)
        with tracing.span("ragent_memory.search", _asked(ask)) as span:
            try:
                found = self._find(ask)
            except StoreError as err:
                log.error("search.failed", session_id=session_id, error=repr(err))
                return (
                    f"[{SEARCH_TOOL_NAME}: the store could not be read just now; try again later]"
                )
            tracing.annotate(span, _found(found))
        return found.text or EMPTY_SEARCH[language]

    def epoch(self) -> str | None:
        """The store's recall deletion epoch, which every delete of index rows (``forget``,
        ``drop_session``, by any process or host) replaces; None when the store cannot say."""
        try:
            return self.store.recall_mark()[1]
        except StoreError as err:
            log.error("recall.mark_failed", error=repr(err))
            return None

    def searched_epoch(self) -> str | None:
        """The deletion epoch the last search read (no more recent than what it found): a
        block found then still holds only rows that exist while :meth:`epoch` returns it."""
        return self.mirror.epoch

    def forget_session(self, session_id: str) -> None:
        """Wait for the session's index writes, then forget its cursor and offloads (a drop
        follows)."""
        self.indexer.flush(self.settings.compaction_timeout_s)
        self.indexer.forget_session(session_id)
        self.offloads.forget(session_id)

    def flush(self, timeout_s: float | None) -> None:
        """Wait until what is scheduled is indexed (and embedded, with dense recall)."""
        self.indexer.flush(timeout_s)
        if self.dense is not None:
            self.dense.flush(timeout_s)

    def memory(self) -> dict[str, int]:
        """The mirror's ``memory()`` with dense recall's vectors in ``bytes`` (both within
        ``cap``): ``vectors``, ``vectors_bytes``, ``vectors_left_out``, ``embed_calls``,
        ``embed_failures``."""
        held = self.mirror.memory()
        dense = self.dense.memory() if self.dense is not None else dict.fromkeys(DENSE_KEYS, 0)
        held["cap"] = self.settings.recall_memory_mb * 1_000_000
        return {**held, **dense, "bytes": held["bytes"] + dense["vectors_bytes"]}

    def close(self) -> None:
        self.indexer.close()
        if self.dense is not None:
            self.dense.close()
