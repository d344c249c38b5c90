"""Optional dense recall (docs/design.md §9b, ``recall.embeddings``): messages found by meaning as well
as by their words, so a question in other words than the answer's still finds it.

- **Vectors**: the indexer's thread, after each write of a session's rows, hands the session to
  this module's own thread (a slow endpoint never delays BM25 indexing or a turn), which embeds
  the session's rows that have no vector from the configured model yet, ``batch_size`` texts a
  call, and keeps them in the store beside their rows (``store/vectors.py``). Rows that could
  not be embedded (the endpoint down) are embedded the next time their session is written;
  rows with a vector are never embedded again, in this process or the next. A batch the
  endpoint refuses as bad input (``EmbeddingRejected``) is split in halves until the texts it
  refuses are alone; once the endpoint has returned vectors for other texts, each of those is
  kept with an empty vector (never sent again for this model, never ranked), so one text it
  will not take cannot hold back the rows after it. An endpoint that has accepted nothing yet
  (a wrong model name answered with 400) marks nothing: the rows wait, as when it is down.
- **Ranking**: cosine similarity between the question's vector (one call in ``prepare``) and the
  vectors the question may see, scoped exactly as BM25 is (the user's rows, and this session's
  rows without a user; without a user, this session's rows; never another user's; not what
  the view shows). The vectors are held in process per user or session (``VectorCache``), read
  from the store as they are written (by their write order) and dropped when rows go (the
  store's deletion epoch), within their share of ``recall_memory_mb``, least recently
  searched first. A unit whose vectors do not fit that share alone keeps its newest that do
  (the oldest dropped as new ones come, an eighth of them at a time) and dense recall ranks
  those, BM25 still every row: a search costs what the share holds, not the history (read
  whole from the store each search, a user's vectors cost a turn time that grows with every
  message they say). ``memory()`` counts the vectors left out.
- **Fusion**: reciprocal rank fusion (Cormack, Clarke and Büttcher, "Reciprocal rank fusion
  outperforms Condorcet and individual rank learning methods", SIGIR 2009) of the BM25 hits
  and the dense top ``DENSE_HITS``: each row scores the sum of 1 / (k + rank) over the lists
  that hold it, k = 60 as in the paper; ties keep BM25's order.

Any failure (the endpoint down or slow past ``timeout_s``, a bad reply, a store error) is
logged and counted (``EmbeddingClient.failures``), and the turn recalls with BM25 alone.
"""

from __future__ import annotations

import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final

import numpy as np

from ragent_memory.core.logs import get_logger
from ragent_memory.core.lru import LRU
from ragent_memory.core.records import IndexedMessage
from ragent_memory.errors import LLMError, StoreError
from ragent_memory.llm.embeddings import EmbeddingClient, EmbeddingRejected, Vectors
from ragent_memory.recall.excerpts import NEIGHBOURS, Ask, Known
from ragent_memory.recall.rank import Found
from ragent_memory.settings import EmbeddingSettings
from ragent_memory.store import VectorIndex
from ragent_memory.store.vectors import VectorRow

log = get_logger(__name__)

RRF_K: Final = 60  # Cormack et al. 2009
DENSE_HITS: Final = 20  # the dense list fused with BM25's
MAX_BATCHES: Final = 1_000  # one embedding job's calls at most (the rest waits for the next)
_FIRST_CAPACITY: Final = 16
SEARCHED_KEPT: Final = 65_536  # users and sessions whose first search was seen
LOAD_VECTORS: Final = 1_024  # vectors read from the store at a time


def reciprocal_rank_fusion(*rankings: Sequence[int], k: int = RRF_K) -> list[int]:
    """The keys of ``rankings`` (best first each) by their summed 1 / (k + rank), rank from 1;
    ties keep the order keys were first seen in."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking, start=1):
            scores[key] = scores.get(key, 0.0) + 1.0 / (k + rank)
    return sorted(scores, key=lambda key: -scores[key])


# a row's id, position, session number and owned flag (21 bytes), with the arrays' slack
ROW_BYTES: Final = 24


class _Unit:
    """The vectors of one user (or one session): unit-length float32 rows and where each
    row sits, grown in place as vectors are written, the oldest dropped past ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.dropped = 0  # vectors left out, oldest first, to stay within max_bytes
        self.seq = 0  # the last write number read
        self.ids = array("q")
        self.positions = array("q")
        self.codes = array("i")  # session number, into ``names``
        self.owned = array("b")
        self.names: list[str] = []
        self.numbers: dict[str, int] = {}
        self.matrix = np.zeros((0, 0), dtype=np.float32)
        self.count = 0

    def nbytes(self) -> int:
        arrays = (self.ids, self.positions, self.codes, self.owned, self.names, self.numbers)
        names = sum(map(sys.getsizeof, self.names))
        return self.matrix.nbytes + names + sum(map(sys.getsizeof, arrays))

    def add(self, rows: Iterable[VectorRow]) -> None:
        for row in rows:
            self.seq = max(self.seq, row.seq)
            vector = np.frombuffer(row.vector[: len(row.vector) // 4 * 4], dtype="<f4")
            if not len(vector):  # a text the endpoint refused (``DenseRecall._embed_rows``)
                continue
            if self.count and len(vector) != self.matrix.shape[1]:
                log.warning("recall.vector_skipped", id=row.id, width=len(vector))
                continue
            if self.count == len(self.matrix):
                self._make_room(len(vector))
            norm = float(np.linalg.norm(vector))
            self.matrix[self.count] = vector / norm if norm > 0 else vector
            self.count += 1
            number = self.numbers.setdefault(row.session_id, len(self.names))
            if number == len(self.names):
                self.names.append(row.session_id)
            self.ids.append(row.id)
            self.positions.append(row.position)
            self.codes.append(number)
            self.owned.append(row.owned)

    def _make_room(self, width: int) -> None:
        """Room for one more row: a larger matrix while the rows that fit ``max_bytes`` are
        more, else the oldest eighth of the rows out."""
        fit = self._fit(width)
        if self.count < fit:
            size = min(max(_FIRST_CAPACITY, 2 * self.count), fit)
            grown = np.zeros((size, width), np.float32)
            if self.count:
                grown[: self.count] = self.matrix[: self.count]
            self.matrix = grown
            return
        self._drop_oldest(max(1, self.count // 8))

    def _fit(self, width: int) -> int:
        """The rows that fit ``max_bytes`` beside what the unit holds besides its rows (a
        sixteenth kept for the arrays' growth steps and new session names)."""
        fixed = self.nbytes() - self.matrix.nbytes - self.count * ROW_BYTES  # names, headers
        return max(1, (self.max_bytes - fixed) * 15 // 16 // (4 * width + ROW_BYTES))

    def _drop_oldest(self, gone: int) -> None:
        if not self.dropped:
            log.info("recall.vectors_capped", kept=self.count - gone, max_bytes=self.max_bytes)
        self.matrix[: self.count - gone] = self.matrix[gone : self.count]
        for held in (self.ids, self.positions, self.codes, self.owned):
            del held[:gone]
        self.count -= gone
        self.dropped += gone

    def limit(self, max_bytes: int) -> None:
        """Keep within ``max_bytes`` from now on: the oldest rows out now if over it."""
        self.max_bytes = max_bytes
        if self.count and self.nbytes() > max_bytes:
            fit = self._fit(self.matrix.shape[1])
            if self.count > fit:
                self._drop_oldest(self.count - fit)
            self.matrix = self.matrix[: self.count].copy()

    def best(self, query: Vectors, ask: Ask, *, unowned_only: bool) -> list[tuple[float, int]]:
        """(cosine, row id) of up to ``DENSE_HITS`` rows ``ask`` may see, best first."""
        if not self.count or query.shape[0] != self.matrix.shape[1]:
            return []
        scores = self.matrix[: self.count] @ query
        allowed = np.ones(self.count, dtype=np.bool_)
        code = self.numbers.get(ask.session_id)
        if code is not None:
            mine = np.frombuffer(self.codes, dtype=np.int32)[: self.count] == code
            positions = np.frombuffer(self.positions, dtype=np.int64)[: self.count]
            held = np.isin(positions, np.fromiter(ask.shown, np.int64, len(ask.shown)))
            allowed &= ~(mine & (positions >= ask.visible_from) & ~held)
        if unowned_only:
            allowed &= np.frombuffer(self.owned, dtype=np.int8)[: self.count] == 0
        scores = np.where(allowed, scores, -np.inf)
        top = min(DENSE_HITS, int(allowed.sum()))
        if not top:
            return []
        chosen = np.argpartition(-scores, top - 1)[:top]
        return [(float(scores[i]), self.ids[int(i)]) for i in chosen]


class VectorCache:
    """Units of vectors kept in step with the store, within ``max_bytes`` (see the module);
    thread-safe (one lock)."""

    def __init__(self, store: VectorIndex, model: str, max_bytes: int) -> None:
        self.store = store
        self.model = model
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._units: OrderedDict[tuple[str, str], _Unit] = OrderedDict()
        self._epoch: str | None = None

    def memory(self) -> dict[str, int]:
        """``vectors`` held and their ``vectors_bytes``."""
        with self._lock:
            units = list(self._units.values())
            return {
                "vectors": sum(unit.count for unit in units),
                "vectors_bytes": sum(unit.nbytes() for unit in units),
                "vectors_left_out": sum(unit.dropped for unit in units),
            }

    def ranked(self, query: Vectors, ask: Ask) -> list[int]:
        """The ids of the rows nearest ``query`` that ``ask`` may see, best first (newest
        first on ties); raises ``StoreError``."""
        norm = float(np.linalg.norm(query))
        query = query / norm if norm > 0 else query
        # The user's rows, and this session's without a user; without a user, the session's.
        wanted = [(("s", ask.session_id), ask.user_id is not None)]
        if ask.user_id is not None:
            wanted.insert(0, (("u", ask.user_id), False))
        found: list[tuple[float, int]] = []
        with self._lock:
            epoch = self.store.recall_mark()[1]
            if epoch != self._epoch:  # rows went: every unit may hold them
                self._units.clear()
                self._epoch = epoch
            used = 0  # this session's rows without a user first: few, and all kept
            for key, unowned_only in reversed(wanted):
                unit = self._unit(key, self.max_bytes - used)
                used += unit.nbytes()
                found += unit.best(query, ask, unowned_only=unowned_only)
            self._bound({key for key, _ in wanted})
        found.sort(key=lambda pair: (-pair[0], -pair[1]))
        return list(dict.fromkeys(row_id for _, row_id in found))[:DENSE_HITS]

    def _unit(self, key: tuple[str, str], max_bytes: int) -> _Unit:
        """The unit ``key`` names, with what was written since it was last read, within
        ``max_bytes`` (lock held)."""
        unit = self._units.get(key) or _Unit(max_bytes)
        unit.limit(max_bytes)
        self._units[key] = unit
        self._units.move_to_end(key)
        user, session = (key[1], "") if key[0] == "u" else (None, key[1])
        while True:  # ``LOAD_VECTORS`` at a time: a first read is not one list of them all
            seq = unit.seq
            rows = self.store.vectors_since(
                seq, user_id=user, session_id=session, model=self.model, limit=LOAD_VECTORS
            )
            unit.add(rows)
            if len(rows) < LOAD_VECTORS or unit.seq == seq:  # each read moves ``seq`` on
                return unit

    def _bound(self, searched: set[tuple[str, str]]) -> None:
        """Least recently searched units out past ``max_bytes``, but those just ``searched``
        (together within it) (lock held)."""
        total = sum(unit.nbytes() for unit in self._units.values())
        for key in [key for key in self._units if key not in searched]:
            if total <= self.max_bytes:
                break
            total -= self._units.pop(key).nbytes()


class DenseRecall:
    """Embedding off the caller's thread, and the dense list fused into a turn's hits."""

    def __init__(
        self,
        store: VectorIndex,
        settings: EmbeddingSettings,
        *,
        max_bytes: int,
        client: EmbeddingClient | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.client = client or EmbeddingClient(settings)
        self.cache = VectorCache(store, settings.model, max_bytes)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragent-embed")
        self._lock = threading.Lock()
        self._pending: set[tuple[str, str]] = set()
        self._searched: LRU[tuple[str, str], None] = LRU(SEARCHED_KEPT)
        self._closing = False
        # Vectors another model made go first (one model per store), off the caller's thread.
        self._last: Future[None] | None = self._pool.submit(self._use_model)

    def _use_model(self) -> None:
        try:
            gone = self.store.use_vector_model(self.settings.model)
        except StoreError as err:  # the vectors of another model are left out of ranking
            log.error("recall.vector_model_failed", error=str(err))
            return
        if gone:
            log.info("recall.vectors_reset", model=self.settings.model, vectors=gone)

    def memory(self) -> dict[str, int]:
        """What the cache holds, and the endpoint's ``embed_calls`` and ``embed_failures``."""
        return {
            **self.cache.memory(),
            "embed_calls": self.client.calls,
            "embed_failures": self.client.failures,
        }

    def schedule(self, session_id: str, user_id: str | None) -> None:
        """Embed the rows without a vector of the user (or, without one, the session), on
        this module's thread."""
        self._submit(("u", user_id) if user_id is not None else ("s", session_id))

    def _submit(self, scope: tuple[str, str]) -> None:
        with self._lock:
            if scope in self._pending:
                return
            self._pending.add(scope)
            try:
                self._last = self._pool.submit(self._embed, scope)
            except RuntimeError:  # closing: the next write or search embeds them
                self._pending.discard(scope)

    def _first_search(self, ask: Ask) -> None:
        """The first search of a user (and of a session) in this process embeds what was
        indexed before (by another process, the endpoint down, embeddings switched on later)."""
        scopes = [("s", ask.session_id), *([("u", ask.user_id)] if ask.user_id else [])]
        for scope in scopes:
            with self._lock:
                if scope in self._searched:
                    continue
                self._searched.put(scope, None)
            self._submit(scope)

    def _embed(self, scope: tuple[str, str]) -> None:
        with self._lock:
            self._pending.discard(scope)  # rows written from now on schedule again
        user_id, session_id = (scope[1], "") if scope[0] == "u" else (None, scope[1])
        size = self.settings.batch_size
        try:
            for _ in range(MAX_BATCHES):
                rows = self.store.unembedded(user_id=user_id, session_id=session_id, limit=size)
                if not rows or self._closing:
                    return
                refused = self._embed_rows(rows)
                if refused and not self.client.accepted:  # the endpoint, not the texts
                    raise LLMError(f"recall.embeddings: {len(refused)} texts refused, none taken")
                for row_id, error in refused:
                    log.warning("recall.embed_refused", id=row_id, error=error)
                self.store.store_vectors(self.settings.model, [(i, b"") for i, _ in refused])
                if len(rows) < size:
                    return
        except (LLMError, StoreError) as err:  # recall goes on with BM25 for these rows
            log.warning("recall.embed_failed", scope=scope[0], error=str(err))
        except Exception as err:  # the worker boundary
            log.error("recall.embed_failed", scope=scope[0], error=repr(err))

    def _embed_rows(self, rows: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
        """Embed ``rows`` (id, text) and keep their vectors; a batch refused as bad input is
        split in halves. Returns the rows refused alone, with the endpoint's answer."""
        try:
            vectors = self.client.embed([text for _, text in rows])
        except EmbeddingRejected as err:
            if len(rows) == 1:
                return [(rows[0][0], str(err))]
            half = len(rows) // 2
            return self._embed_rows(rows[:half]) + self._embed_rows(rows[half:])
        blobs = [vector.astype("<f4").tobytes() for vector in vectors]
        self.store.store_vectors(
            self.settings.model, list(zip((i for i, _ in rows), blobs, strict=True))
        )
        return []

    def fuse(self, found: Found, ask: Ask, known: Known) -> Found:
        """``found`` (BM25's hits, best first, and their neighbours) fused with the dense
        list by reciprocal rank; ``found`` itself when the dense side fails."""
        hits, around = found
        self._first_search(ask)
        try:
            (query,) = self.client.embed([ask.text])
            ranked = self.cache.ranked(query, ask)
            have = {hit.id: hit for hit in hits}
            read = self.store.indexed_rows([i for i in ranked if i not in have])
            new = {row.id: row for row in read if not known(row.content)}
            around = {**around, **self._neighbours(new.values())}
        except (LLMError, StoreError) as err:  # recall is help: BM25 alone this turn
            log.warning("recall.dense_failed", session_id=ask.session_id, error=str(err))
            return found
        rows = {**have, **new}
        dense = [i for i in ranked if i in rows]
        order = reciprocal_rank_fusion(list(have), dense)
        return [rows[i] for i in order], around

    def _neighbours(self, hits: Iterable[IndexedMessage]) -> dict[tuple[str, int], IndexedMessage]:
        """The rows beside ``hits`` by (session, position), read from the store."""
        wanted: dict[str, set[int]] = {}
        for hit in hits:
            wanted.setdefault(hit.session_id, set()).update(hit.position + d for d in NEIGHBOURS)
        return {
            (sid, row.position): row
            for sid, positions in wanted.items()
            for row in self.store.indexed_at(sid, sorted(positions))
        }

    def flush(self, timeout_s: float | None) -> None:
        """Wait until the embedding jobs scheduled so far are done."""
        with self._lock:
            last = self._last
        if last is not None:
            last.result(timeout=timeout_s)

    def close(self) -> None:
        """Stop after the batch in flight (what is left is embedded by a later process)."""
        self._closing = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.client.close()
