"""The recall ranker, and an in-process copy of the recall index (docs/design.md §9b), so a
turn's recall costs what is new.

The ranking is the one code every backend's rows go through: the mirror's units below, and,
where the mirror cannot answer, the store's candidate rows (``rank_candidates``: the rows
holding the question's keys, with the statistics of all the rows searched). Ranking in the
store (FTS5's ``bm25()`` recounts every phrase's document frequency and scores every match on
each call, growing with the history) would also rank by each backend's own formula.

Each user's rows (or, without a user, each session's) are an inverted index (term → rows and
counts) ranked with the exact BM25 FTS5 computes (k1 = 1.2, b = 0.75, its idf floor, row
lengths in tokens of both columns); the top
k comes from block-max early termination (``topk.py``), so a query reads a bounded share of
its terms' postings, not every match. Neighbours and texts (kept by row id: rows never
change, only go) come from here too.

Memory is counted as rows arrive (``sys.getsizeof`` of what a unit holds) and bounded by
``recall_memory_mb``: three quarters for the units, least recently searched dropped first (a
unit larger than that alone is not kept: its user's searches go to the store), a quarter for
row texts, the oldest dropped first.

The store stays the source of truth. Before each search one statement reads the highest row
id and the deletion epoch (``meta.recall_epoch``, replaced in the transaction of every
``forget``/``drop_session``, whichever process or host ran it): new rows are read by id, a
new epoch drops every copy (rebuilt on their next search). A user's search that must also see
this session's rows indexed without a user returns None: the caller ranks the store's
candidates (``rank_candidates``) instead.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from ragent_memory.core.lru import LRU
from ragent_memory.core.memo import Memo
from ragent_memory.core.records import IndexedMessage
from ragent_memory.recall.topk import (
    BUDGET_BLOCKS,
    COUNT_BITS,
    COUNT_MAX,
    DENSE,
    K1,
    LONG,
    SATURATED,
    B,
    Blocks,
    Norm,
    Term,
    top_k,
)
from ragent_memory.store import Candidates
from ragent_memory.store.contract import RecallIndex
from ragent_memory.text.keys import query_keys, text_terms
from ragent_memory.text.porter import stem

IDF_FLOOR: Final = 1e-6  # FTS5: a term in more than half the rows still counts a little
MEMORY_BYTES: Final = 128 * 1_000_000  # the default bound: ``Settings.recall_memory_mb``
TEXT_SHARE: Final = 4  # row texts kept take 1/4 of it, the units the rest
TEXT_ENTRY_BYTES: Final = 100  # an ordered dict's entry for a text: its key, links, slot
STEM_CHARS: Final = 2_000_000  # tokens whose stem is kept, by their length
HOP_FROM: Final = 3  # a second hop starts from the best hits' texts
HOP_TERMS: Final = 4  # and searches their rarest terms
HOP_SOURCE_CHARS: Final = 2_000  # of what was said (a tool's dump names too much)
HOP_TERMS_CHARS: Final = 2_000_000  # hop source texts whose terms are kept, by their length
UNOWNED_KEPT: Final = 65_536  # sessions whose rows without a user were looked for
LOAD_ROWS: Final = 4_096  # rows a unit reads from the store at a time

# The best hits, and their neighbours by (session, position).
Found = tuple[list[IndexedMessage], dict[tuple[str, int], IndexedMessage]]
_Row = tuple[IndexedMessage, bool, dict[str, int], int]  # a row, owned, its terms, its length
_NONE: Final = np.zeros(0, dtype=np.int64)  # no rows


def rank_candidates(
    store: RecallIndex,
    terms: Sequence[str],
    *,
    session_id: str,
    user_id: str | None,
    visible_from: int,
    shown: Sequence[int],
    limit: int,
) -> list[IndexedMessage]:
    """The best ``limit`` hits for ``terms`` among the rows the store finds for them
    (``recall_candidates``), ranked by the mirror's own code with the statistics of all the
    rows searched: a search the mirror cannot answer ranks as it would, on every backend."""
    found = store.recall_candidates(terms, session_id=session_id, user_id=user_id)
    known: dict[str, str] = {}  # each word's stem, once a search (its rows share words)

    def stems(words: Sequence[str]) -> list[str]:
        return [
            known[word] if word in known else known.setdefault(word, stem(word)) for word in words
        ]

    unit = _Unit()
    for message, owned, length in found.found:  # id order: ties go to the newest, as there
        unit.add(message, owned, text_terms(message.content, stems)[0], length)
    where = {"session_id": session_id, "visible_from": visible_from, "shown": shown}
    ranked = unit.rank(query_keys(terms), limit=limit, stats=found, **where)  # type: ignore[arg-type]
    contents = [message.content for message, _, _ in found.found]
    return [unit.message(row, contents[row], score) for row, score in ranked]


def _text_bytes(_row_id: int, text: str) -> int:
    """What a row text kept in the mirror holds: the text and its entry."""
    return sys.getsizeof(text) + TEXT_ENTRY_BYTES


class _Unit:
    """One user's rows (or one session's): the inverted index and what rows carry, its
    memory counted as it grows (``nbytes``)."""

    def __init__(self) -> None:
        self.last = 0  # highest row id held
        self.ids = array("q")
        self.positions = array("q")
        self.codes = array("i")  # session number, into ``names``
        self.lengths = array("d")
        self.roles = array("b")  # into ``role_names``
        self.dates = array("i")  # into ``dated``
        self.digests: list[str] = []
        self.names: list[str] = []
        self.numbers: dict[str, int] = {}
        self.dated: list[str] = []
        self.date_numbers: dict[str, int] = {}
        self.role_names: list[str] = []
        self.role_numbers: dict[str, int] = {}
        # term → its rows and counts, each ``row << 20 | count``: an int for one row (most
        # terms, numbers and ids, occur in one row), an array for more
        self.postings: dict[str, int | array[int]] = {}
        self.blocks: dict[str, Blocks] = {}  # a long term's block bounds (topk.py)
        self.dense: dict[str, array[int]] = {}  # a common term's count per row (topk.Term)
        self.at: dict[int, int] = {}  # session number << 32 | position → newest row
        self.tops: dict[int, int] = {}  # session number → its highest position held
        self.total = 0.0
        self._held = 0  # bytes of what the containers point at (``nbytes`` adds theirs)

    def nbytes(self) -> int:
        """The bytes this unit holds: its containers (``sys.getsizeof``) and what they
        point at, counted as it was added."""
        containers = (
            *(self.ids, self.positions, self.codes, self.lengths, self.roles, self.dates),
            *(self.digests, self.names, self.numbers, self.dated, self.date_numbers),
            *(self.role_names, self.role_numbers),
            *(self.postings, self.blocks, self.dense, self.at, self.tops),
        )
        return self._held + sum(map(sys.getsizeof, containers))

    def _number(self, names: list[str], numbers: dict[str, int], name: str) -> int:
        number = numbers.setdefault(name, len(names))
        if number == len(names):
            names.append(name)
            self._held += sys.getsizeof(name)
        return number

    def add(self, message: IndexedMessage, owned: bool, counts: dict[str, int], n: int) -> None:
        row = len(self.ids)
        code = self._number(self.names, self.numbers, message.session_id)
        length = n + 1 + owned  # FTS5 counts the scope column's tokens in the row's length
        self.ids.append(message.id)
        self.positions.append(message.position)
        self.codes.append(code)
        self.lengths.append(float(length))
        self.roles.append(self._number(self.role_names, self.role_numbers, message.role))
        self.dates.append(self._number(self.dated, self.date_numbers, message.dated))
        self.digests.append(message.digest)
        self._held += sys.getsizeof(message.digest)
        self.total += length
        self.last = max(self.last, message.id)
        key = code << 32 | message.position
        held = self.at.get(key)
        if held is None:
            self._held += 2 * sys.getsizeof(key)
        if held is None or self.ids[held] < message.id:
            self.at[key] = row
        self.tops[code] = max(self.tops.get(code, -1), message.position)
        for term, count in counts.items():
            self._post(term, row, min(count, COUNT_MAX), length)

    def _post(self, term: str, row: int, count: int, length: int) -> None:
        entry = row << COUNT_BITS | count
        posting = self.postings.get(term)
        if posting is None:
            self.postings[term] = entry
            self._held += sys.getsizeof(term) + sys.getsizeof(entry)
        elif isinstance(posting, int):
            self.postings[term] = made = array("q", (posting, entry))
            self._held += sys.getsizeof(made) - sys.getsizeof(posting)
        else:
            before = sys.getsizeof(posting)
            posting.append(entry)
            self._held += sys.getsizeof(posting) - before
            blocks = self.blocks.get(term)
            if blocks is None and len(posting) > LONG:
                self.blocks[term] = blocks = Blocks()
                for index, old in enumerate(posting):
                    at = old >> COUNT_BITS
                    blocks.add(at, index, old & COUNT_MAX, int(self.lengths[at]))
                self._held += blocks.nbytes()
            elif blocks is not None:
                before = blocks.nbytes()
                blocks.add(row, len(posting) - 1, count, length)
                self._held += blocks.nbytes() - before
                self._count(term, posting, row, count)

    def _count(self, term: str, posting: array[int], row: int, count: int) -> None:
        """A long term's count in ``row`` into its counts per row, which it gets once it is
        in ``1/DENSE`` of the rows (from then on kept: the rows it is in only grow)."""
        dense = self.dense.get(term)
        if dense is None:
            if len(posting) * DENSE <= row:
                return
            self.dense[term] = dense = array("B", bytes(row + 1))
            for old in posting:
                dense[old >> COUNT_BITS] = min(old & COUNT_MAX, SATURATED)
            self._held += sys.getsizeof(dense)
            return
        before = sys.getsizeof(dense)
        dense.frombytes(bytes(row - len(dense)))
        dense.append(min(count, SATURATED))
        self._held += sys.getsizeof(dense) - before

    def rank(
        self,
        keys: Sequence[str],
        *,
        session_id: str,
        visible_from: int,
        shown: Sequence[int],
        limit: int,
        budget: int = BUDGET_BLOCKS,
        stats: Candidates | None = None,
    ) -> list[tuple[int, float]]:
        """The best ``limit`` rows (row number, BM25 as FTS5 gives it: lower is better),
        ordered by score then newest first, without this session's rows the view shows:
        block-max top-k reading ``budget`` blocks at most (``topk.py``). The statistics are
        the unit's own, or ``stats`` (those of the rows a store's candidates come from)."""
        n = len(self.ids) if stats is None else stats.rows
        total = self.total if stats is None else stats.tokens
        terms = []
        for key, times in Counter(keys).items():
            posting = self.postings.get(key)
            if posting is None:
                continue
            count = 1 if isinstance(posting, int) else len(posting)
            if stats is not None:
                count = stats.frequencies.get(key, count)
            idf = math.log((n - count + 0.5) / (count + 0.5))
            weight = times * (idf if idf > 0 else IDF_FLOOR) * (K1 + 1.0)
            if isinstance(posting, int):
                postings = np.array([posting], dtype=np.int64)
            else:
                postings = np.frombuffer(posting, dtype=np.int64)
            dense = self.dense.get(key)
            counts = None if dense is None else np.frombuffer(dense, dtype=np.uint8)
            terms.append(Term(weight, postings, self.blocks.get(key), counts))
        if not terms or limit < 1:
            return []
        lengths = np.frombuffer(self.lengths, dtype=np.float64)
        norm = Norm(lengths, K1 * B * n / total, K1 * (1.0 - B))
        visible = self._visible(session_id, visible_from, shown)
        rows, scores = top_k(terms, norm, len(self.ids), limit, visible, budget)
        return [(row, -score) for row, score in zip(rows.tolist(), scores.tolist(), strict=True)]

    def in_view(
        self, session_id: str, visible_from: int, shown: Sequence[int]
    ) -> npt.NDArray[np.int64]:
        """The rows of ``session_id`` its view shows (at ``visible_from`` or after, not in
        ``shown``), ascending; bounded by the view's messages, not the history. The second
        hop leaves them out when it counts a term's rows: whether ``after_turn`` (on a
        thread of its own) indexed them yet must not change which terms it searches."""
        code = self.numbers.get(session_id)
        top = -1 if code is None else self.tops.get(code, -1)
        if top < visible_from or code is None:
            return _NONE
        held = frozenset(shown)
        rows = (self.at.get(code << 32 | p) for p in range(visible_from, top + 1) if p not in held)
        return np.array(sorted(row for row in rows if row is not None), dtype=np.int64)

    @staticmethod
    def rows_with(posting: int | array[int], unseen: npt.NDArray[np.int64]) -> int:
        """How many rows ``posting`` is in, those in ``unseen`` (ascending) left out."""
        if isinstance(posting, int):
            return 0 if len(unseen) and (posting >> COUNT_BITS) in unseen else 1
        if not len(unseen):
            return len(posting)
        rows = np.frombuffer(posting, dtype=np.int64) >> COUNT_BITS  # ascending: rows only grow
        at = np.minimum(rows.searchsorted(unseen), len(rows) - 1)
        return len(posting) - int(np.count_nonzero(rows[at] == unseen))

    def _visible(
        self, session_id: str, visible_from: int, shown: Sequence[int]
    ) -> Callable[[npt.NDArray[np.int64]], npt.NDArray[np.bool_]]:
        """Which of some rows the search may show: not this session's rows the view shows
        (those it shows as a placeholder or preview, ``shown``, are recalled after all)."""
        code = self.numbers.get(session_id)
        # Sorted is enough for searchsorted (np.unique's first call imports numpy.ma,
        # tens of ms on a process's first recall turn).
        held = np.sort(np.asarray(shown, dtype=np.int64))

        def visible(rows: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
            if code is None:
                return np.ones(len(rows), dtype=np.bool_)
            positions = np.frombuffer(self.positions, dtype=np.int64)[rows]
            codes = np.frombuffer(self.codes, dtype=np.int32)[rows]
            hidden = (codes == code) & (positions >= visible_from)
            if len(held):
                at = np.minimum(held.searchsorted(positions), len(held) - 1)
                hidden &= held[at] != positions
            kept: npt.NDArray[np.bool_] = ~hidden
            return kept

        return visible

    def message(self, row: int, content: str, score: float = 0.0) -> IndexedMessage:
        session, role = self.names[self.codes[row]], self.role_names[self.roles[row]]
        dated, digest = self.dated[self.dates[row]], self.digests[row]
        return IndexedMessage(
            session, self.positions[row], role, content, dated, digest, self.ids[row], score
        )

    def near(self, row: int, offset: int) -> int | None:
        """The newest row at ``offset`` positions from ``row`` in its session."""
        return self.at.get(self.codes[row] << 32 | (self.positions[row] + offset))


class RecallMirror:
    """Units (a user's rows, or a session's without a user) kept in step with the store,
    within ``max_bytes`` (see the module); thread-safe (one lock)."""

    def __init__(
        self,
        store: RecallIndex,
        *,
        neighbours: Sequence[int] = (-1, 1),
        max_bytes: int = MEMORY_BYTES,
        hop: int = 0,
    ) -> None:
        self.store = store
        self.neighbours = tuple(neighbours)
        self.max_bytes = max_bytes
        self.hop = hop  # second-hop hits after a search's own (``search``)
        self._lock = threading.Lock()
        # units, least recently searched out past their share (``_Unit.nbytes`` summed)
        share = max_bytes - max_bytes // TEXT_SHARE
        self._units: LRU[tuple[str, str], _Unit] = LRU(None, share, lambda _, unit: unit.nbytes())
        # units too large to keep alone: their searches go to the store
        self._oversized: LRU[tuple[str, str], None] = LRU(UNOWNED_KEPT)
        self._epoch: str | None = None
        # session → (checked to id, any)
        self._unowned: LRU[str, tuple[int, bool]] = LRU(UNOWNED_KEPT)
        self._writing: set[tuple[str, str]] = set()  # units the indexer is writing rows of
        # row texts read, the first read first out past the rest of ``max_bytes``
        self._texts: LRU[int, str] = LRU(None, max_bytes // TEXT_SHARE, _text_bytes)
        self.stem = Memo(stem, STEM_CHARS, len)  # Porter in Python is most of reading a row in
        # the best hits come back turn after turn: their terms for the second hop, kept
        self.hop_terms = Memo(self._terms, HOP_TERMS_CHARS, len)

    def memory(self) -> dict[str, int]:
        """What the mirror holds: ``bytes`` (units and texts), ``units_bytes``, ``rows``
        (indexed messages held), ``users`` (units held), ``cap`` (``max_bytes``)."""
        with self._lock:
            rows = sum(len(unit.ids) for unit in self._units.values())
            return {
                "bytes": self._units.weight + self._texts.weight,
                "units_bytes": self._units.weight,
                "rows": rows,
                "users": len(self._units),
                "cap": self.max_bytes,
            }

    @property
    def epoch(self) -> str | None:
        """The deletion epoch the last search read (None before the first)."""
        return self._epoch

    def search(
        self,
        terms: Sequence[str],
        *,
        session_id: str,
        user_id: str | None,
        visible_from: int,
        shown: Sequence[int],
        limit: int,
        keep: Callable[[str], bool] = lambda text: True,
    ) -> Found | None:
        """The best hits as ``rank_candidates`` ranks them, those whose text
        ``keep`` keeps, and their neighbours by (session, position); None when the store
        must answer (see the module). With ``hop`` (the mirror's), up to that many more hits
        after them: a second search for the rarest terms of the best hits' own texts (those
        in two rows or more and ``LONG`` or fewer, not asked already; texts up to
        ``HOP_SOURCE_CHARS``), for what the question's words do not name."""
        with self._lock:
            unit = self._current(user_id, session_id)
            if unit is None:
                return None
            keys = query_keys(terms, self.stem)
            where = {"session_id": session_id, "visible_from": visible_from, "shown": shown}
            ranked = unit.rank(keys, limit=limit, **where)  # type: ignore[arg-type]
            hop = self.hop
            if hop and ranked:  # (a bounded second ranking: rare terms, short postings)
                texts = self._read([unit.ids[row] for row, _ in ranked[:HOP_FROM]])
                said = [text for text in texts.values() if len(text) <= HOP_SOURCE_CHARS]
                unseen = unit.in_view(session_id, visible_from, shown)
                rare = self._rarest(unit, said, set(keys), unseen)
                held = {row for row, _ in ranked}
                more = unit.rank(rare, limit=hop + len(held), **where)  # type: ignore[arg-type]
                ranked += [(row, score) for row, score in more if row not in held][:hop]
            return self._found(unit, ranked, keep)

    def _rarest(
        self, unit: _Unit, texts: Iterable[str], asked: set[str], unseen: npt.NDArray[np.int64]
    ) -> list[str]:
        """The ``HOP_TERMS`` terms of ``texts`` in the fewest rows (two at least: one is the
        text itself; ``LONG`` at most, so a hop reads a bounded number of postings however
        long the history: a term in more rows names nothing a question missed), none of
        ``asked``, rarest first; rows in ``unseen`` (``_Unit.in_view``) not counted."""
        found: dict[str, int] = {}
        for text in texts:
            for key in self.hop_terms(text):
                posting = unit.postings.get(key)
                if key in asked or posting is None or isinstance(posting, int):
                    continue  # (one row: the text itself)
                if len(posting) - len(unseen) > LONG:
                    continue  # in more than LONG rows, however many of them the view shows
                count = unit.rows_with(posting, unseen)
                if 2 <= count <= LONG:
                    found[key] = count
        return sorted(found, key=lambda key: (found[key], key))[:HOP_TERMS]

    def _terms(self, text: str) -> tuple[str, ...]:
        return tuple(text_terms(text, self.stem.many)[0])

    def _current(self, user_id: str | None, session_id: str) -> _Unit | None:
        """The unit searched, in step with the store's mark (lock held)."""
        top, epoch = self.store.recall_mark()
        if epoch != self._epoch:  # rows went: every copy may hold them
            self._units.clear()
            self._unowned.clear()
            self._oversized.clear()
            self._epoch = epoch
        if user_id is not None and self._has_unowned(session_id, top):
            return None
        key = ("u", user_id) if user_id is not None else ("s", session_id)
        if key in self._oversized:
            return None
        unit = self._units.get(key)
        if unit is None:
            unit = _Unit()
            self._units.put(key, unit)
        # This process's own rows being written are left to the refresh that follows the
        # write (read in off the caller's thread): the unit answers as before it.
        if unit.last < top and (not unit.last or key not in self._writing):
            self._load(key, unit, user_id, session_id)
        return self._units.peek(key)

    def _load(
        self, key: tuple[str, str], unit: _Unit, user_id: str | None, session_id: str
    ) -> None:
        """The store's rows past the unit's last into it, ``LOAD_ROWS`` at a time: a first
        search of a long history reads it in chunks, not as one list of every row and its
        terms (that list, freed, leaves the process larger by what it held: the allocator
        keeps the pages) (lock held). Each chunk moves ``unit.last`` on, so the loop ends."""
        while self._units.peek(key) is unit:
            last = unit.last
            rows = self._since(last, user_id, session_id, LOAD_ROWS)
            self._add(key, unit, rows)
            if len(rows) < LOAD_ROWS or unit.last == last:
                return

    def _found(
        self, unit: _Unit, ranked: Sequence[tuple[int, float]], keep: Callable[[str], bool]
    ) -> Found:
        """The ranked rows ``keep`` keeps as hits, with their neighbours (the newest row at
        each position beside a hit), their texts read; a row another process deleted since
        the mark is left out (its epoch is seen next search)."""
        texts = self._read([unit.ids[row] for row, _ in ranked])
        made: dict[int, IndexedMessage] = {}  # row → its hit, best first
        for row, score in ranked:
            text = texts.get(unit.ids[row])
            if text is not None and keep(text):
                made[row] = unit.message(row, text, score)
        beside: dict[tuple[int, int], int] = {}  # (session number, position) → the row there
        for row in made:
            code, position = unit.codes[row], unit.positions[row]
            for offset in self.neighbours:
                near = unit.near(row, offset)
                if near is not None:
                    beside[(code, position + offset)] = near
        texts.update(self._read([unit.ids[near] for near in beside.values()]))
        around = {}
        for (code, position), near in beside.items():
            text = texts.get(unit.ids[near])
            if text is not None:
                around[(unit.names[code], position)] = unit.message(near, text)
        return list(made.values()), around

    @contextlib.contextmanager
    def writing(self, user_id: str | None, session_id: str) -> Iterator[None]:
        """Around the indexer's write of one session's rows: a search meanwhile reads no new
        rows into the units the write touches; after it, the refresh reads them in, counted
        outside the lock (a search waits for none of that), if those units are held. After
        a write of a user's rows, whether the session has rows without a user is asked
        here too: the turn's search then needs not ask unless rows came since."""
        keys = (("u", user_id), ("s", session_id)) if user_id else (("s", session_id),)
        with self._lock:
            self._writing.update(keys)
        try:
            yield
            for key in keys:
                with self._lock:
                    unit = self._units.peek(key)
                if unit is not None:
                    rows = self._since(unit.last, key[1] if key[0] == "u" else None, session_id)
                    with self._lock:
                        self._add(key, unit, rows)
            with self._lock:
                if user_id is not None and session_id in self._unowned:
                    self._has_unowned(session_id, self.store.recall_mark()[0])
        finally:
            with self._lock:
                self._writing.difference_update(keys)

    def _has_unowned(self, session_id: str, top: int) -> bool:
        """Whether the session has rows indexed without a user (a user's search sees them)."""
        checked, found = self._unowned.peek(session_id, (0, False))
        if not found and checked < top:
            found = self.store.unowned_since(session_id, checked)
            self._unowned.put(session_id, (top, found))
        return found

    def _since(
        self, last: int, user_id: str | None, session_id: str, limit: int | None = None
    ) -> list[_Row]:
        """The store's rows past id ``last`` for a unit (the first ``limit``), with their
        terms counted."""
        rows = self.store.indexed_since(last, user_id=user_id, session_id=session_id, limit=limit)
        return [(m, o, *text_terms(m.content, self.stem.many)) for m, o in rows if m.id > last]

    def _add(self, key: tuple[str, str], unit: _Unit, rows: Sequence[_Row]) -> None:
        """Rows into the unit if it is still held (those it lacks), then the units kept
        within their share, least recently searched out first; a unit over it alone is
        dropped and left to the store from then on (lock held)."""
        if self._units.peek(key) is not unit:
            return
        before = unit.nbytes()
        for message, owned, counts, n in rows:
            if message.id > unit.last:
                unit.add(message, owned, counts, n)
                self._keep(message.id, message.content)
        size = unit.nbytes()
        self._units.resized(key, size - before)
        if size > (self._units.max_weight or 0):  # the unit alone is over the units' share
            self._units.pop(key)
            self._oversized.put(key, None)
        self._units.trim()

    def _keep(self, row_id: int, text: str) -> None:
        if row_id not in self._texts:
            self._texts.put(row_id, text)

    def _read(self, ids: Sequence[int]) -> dict[int, str]:
        """Row texts by id, from those kept or (those let go) the store."""
        texts = self._texts
        out = {row_id: text for row_id in ids if (text := texts.peek(row_id)) is not None}
        missing = [row_id for row_id in ids if row_id not in out]
        if missing:
            for row_id, text in self.store.indexed_texts(missing).items():
                out[row_id] = text
                self._keep(row_id, text)
        return out
