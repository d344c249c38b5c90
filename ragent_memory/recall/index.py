"""The recall index writer (docs/design.md §9b): a session's messages into the store's recall index on
a background thread of its own (never the caller's), in order, each with the date stamp in
force where it was said. ``schedule`` does only O(new messages) work on the caller's thread;
``flush`` waits."""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Final

from ragent_memory.core.chars import Message, Role, text_of
from ragent_memory.core.logs import get_logger
from ragent_memory.core.provenance import Markers
from ragent_memory.core.records import IndexedMessage
from ragent_memory.recall.rank import RecallMirror
from ragent_memory.store import RecallIndex
from ragent_memory.text.terms import date_stamp, index_terms

log = get_logger(__name__)

INDEXED_ROLES: Final[frozenset[Role]] = frozenset({"user", "assistant", "tool"})


def index_digest(role: str, text: str) -> str:
    """What identifies an indexed message's content (an edit changes it)."""
    return hashlib.sha256(f"{role}\0{text}".encode("utf-8", "surrogatepass")).hexdigest()[:24]


_Item = tuple[int, str, str]  # a message to index: (position, role, text)


class Indexer:
    """Indexes sessions in the background, one message batch at a time, in order.

    A per-session cursor (count handed over, the last message) keeps :meth:`schedule`
    proportional to what is new; a shorter history, or one whose message at the cursor
    changed (neither the same object nor an equal one), re-reads the session from the start
    (positions already indexed with the same content are skipped by the store).
    """

    def __init__(
        self,
        store: RecallIndex,
        *,
        engine_headers: Sequence[str] = (),
        markers: Markers | None = None,
        mirror: RecallMirror | None = None,
        on_left: Callable[[Sequence[IndexedMessage]], None] | None = None,
        on_written: Callable[[str, str | None], None] | None = None,
    ) -> None:
        self.store = store
        self.mirror = mirror  # refreshed after each batch, off the caller's thread
        self.on_left = on_left  # readies rows that left a view for their first recall
        self.on_written = on_written  # hears of each write (dense recall embeds it)
        self.engine_headers = tuple(engine_headers)
        self.markers = markers or Markers()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragent-index")
        self._lock = threading.Lock()
        self._cursors: dict[str, tuple[int, Message]] = {}
        # session → (its latest batch, the first position in it)
        self._batches: dict[str, tuple[Future[None], int]] = {}
        self._dated: dict[str, str] = {}  # session → date stamp in force (worker thread only)
        self._last: Future[None] | None = None

    def text(self, message: Message) -> str:
        """What recall indexes of a message: a user message's own words (the harness's text
        and the engine's blocks left out: they are not what the user said), an assistant's
        or a tool's text unless it is one of the engine's blocks; "" for nothing."""
        role = message.get("role")
        if role == "user":
            return self.markers.user_text(message, self.engine_headers)
        text = text_of(message).strip() if role in INDEXED_ROLES else ""
        return "" if text.startswith(self.engine_headers) else text

    def _items(self, pairs: Iterable[tuple[int, Message]]) -> list[_Item]:
        """The messages recall indexes (see ``text``), with their positions and roles."""
        items = []
        for position, message in pairs:
            text = self.text(message)
            if text:
                items.append((position, str(message.get("role")), text))
        return items

    def schedule(
        self,
        messages: Sequence[Message],
        *,
        session_id: str,
        user_id: str | None,
        end: int | None = None,
    ) -> None:
        """Index ``messages[:end]`` (all by default) of the session: what is new since the
        last call is handed to the background thread."""
        end = len(messages) if end is None else min(end, len(messages))
        with self._lock:
            cursor = self._cursors.get(session_id)
            if cursor is None:
                seen = self._resume(messages, session_id)
            else:
                seen, last = cursor
                if seen > len(messages) or (
                    seen and messages[seen - 1] is not last and messages[seen - 1] != last
                ):
                    seen = 0
            if end <= seen:
                return
            items = self._items((p, messages[p]) for p in range(seen, end))
            self._cursors[session_id] = (end, messages[end - 1])
            if items:
                self._submit(session_id, user_id, items, seen)

    def add(
        self, session_id: str, user_id: str | None, pairs: Sequence[tuple[int, Message]]
    ) -> None:
        """Index these ``(raw index, message)`` pairs (messages that just left the view)."""
        items = self._items(pairs)
        if items:
            with self._lock:
                self._submit(session_id, user_id, items, -1)

    def _submit(self, session_id: str, user_id: str | None, items: list[_Item], start: int) -> None:
        """Hand a batch to the worker (lock held) and remember it as the session's latest,
        with the lowest position still being written (one worker runs batches in order: the
        latest done means all done). ``start`` -1: messages that left a view, which a
        search must see."""
        try:
            future = self._pool.submit(self._write, session_id, user_id, items, start)
        except RuntimeError:  # closing: the next engine re-reads what was not indexed
            log.warning("recall.index_not_scheduled", session_id=session_id)
            return
        self._last = future
        first = -1 if start < 0 else items[0][0]
        previous = self._batches.get(session_id)
        if previous is not None and not previous[0].done():
            first = min(first, previous[1])
        self._batches[session_id] = (future, first)

    def _resume(self, messages: Sequence[Message], session_id: str) -> int:
        """Where a session seen for the first time (a restart) continues: after the last
        message the store indexed, if the history still holds it there."""
        last = self.store.last_indexed(session_id)
        if last is None or last.position >= len(messages):
            return 0
        message = messages[last.position]
        if index_digest(str(message.get("role")), self.text(message)) != last.digest:
            return 0
        return last.position + 1

    def wait_for(self, session_id: str, before: int, timeout_s: float) -> None:
        """Wait for the session's latest batch if it indexes a position below ``before``,
        so a search sees what left the view in the same call (deterministic output). With
        ``timeout_s`` 0 (``compaction_timeout_s: 0``, a turn never waits) the search goes on
        without it, as configured: no warning."""
        with self._lock:
            batch = self._batches.get(session_id)
        if batch is None or batch[1] >= before or batch[0].done() or timeout_s <= 0:
            return
        # The batch's own failures end at its worker boundary (_write): only time is left.
        if wait([batch[0]], timeout=timeout_s).not_done:  # search without it this turn
            log.warning("recall.index_wait_timeout", session_id=session_id, timeout_s=timeout_s)

    def _write(self, session_id: str, user_id: str | None, items: list[_Item], start: int) -> None:
        try:
            dated = self._dated.get(session_id)
            if dated is None or start == 0:  # start -1: messages that left a view
                last = self.store.last_indexed(session_id) if start else None
                dated = last.dated if last is not None else ""
            rows = []
            for position, role, text in items:
                dated = date_stamp(text) or dated
                digest = index_digest(role, text)
                rows.append(IndexedMessage(session_id, position, role, text, dated, digest))
            terms = [index_terms(row.content) for row in rows]
            if self.mirror is None:
                self.store.index_messages(user_id, rows, terms)
            else:
                with self.mirror.writing(user_id, session_id):
                    self.store.index_messages(user_id, rows, terms)
            self._dated[session_id] = dated
            if self.on_written is not None:
                self.on_written(session_id, user_id)
            if start < 0 and self.on_left is not None:  # a task of its own: no search waits
                with self._lock, contextlib.suppress(RuntimeError):  # closing: none wanted
                    self._last = self._pool.submit(self.on_left, rows)
        except Exception as err:  # the worker boundary: a failed batch is re-read on restart
            log.error("recall.index_failed", session_id=session_id, error=repr(err))

    def forget_session(self, session_id: str) -> None:
        with self._lock:
            self._cursors.pop(session_id, None)
            self._batches.pop(session_id, None)
        self._dated.pop(session_id, None)

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until everything scheduled so far is indexed."""
        with self._lock:
            last = self._last
        if last is not None:
            last.result(timeout=timeout_s)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
