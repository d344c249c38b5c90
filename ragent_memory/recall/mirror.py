"""An in-process copy of the recall index (DESIGN §9b), so a turn's recall costs what is new.

The store's FTS5 ``bm25()`` recounts every query phrase's document frequency and scores every
match on each call: with a question's common words matching a quarter of the index, that was
most of ``prepare``'s time, growing with the history. Here each user's rows (or, without a
user, each session's) are held as an inverted index: term → (row numbers, term counts), row
lengths, and the exact BM25 FTS5 computes (k1 = 1.2, b = 0.75, its idf floor, the row's
length in tokens of both columns) over those rows: in Python for a query with few postings
(this session's rows in the view passed over first), vectorised with numpy for one with
many (``PYTHON_POSTINGS``). Neighbouring rows and texts come from here too (texts cached by
row id: rows never change, only go), each hit with its neighbours made once and kept.

The store stays the source of truth. Before each search one statement reads the highest row
id and the deletion epoch (``meta.recall_epoch``, replaced in the transaction of every
``forget``/``drop_session``, whichever process or host ran it): new rows are read by id, a
new epoch drops every copy (rebuilt on their next search). A user's search that must also see
this session's rows indexed without a user returns None: the caller asks the store.
Statistics are those of the unit searched (the user's rows), where FTS5's are the whole
table's: with one user per store they are the same numbers.
"""

from __future__ import annotations

import contextlib
import math
import operator
import re
import threading
from array import array
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

import numpy as np

from ragent_memory.core.records import IndexedMessage
from ragent_memory.store.contract import RecallIndex
from ragent_memory.text.porter import fold, stem, tokens
from ragent_memory.text.terms import CJK, CJK_RUN, WORD, index_terms

K1: Final = 1.2
B: Final = 0.75
IDF_FLOOR: Final = 1e-6  # FTS5: a term in more than half the rows still counts a little
_COUNT_BITS: Final = 20
_COUNT_MAX: Final = (1 << _COUNT_BITS) - 1  # a term's count in one row, capped (FTS5's is not)
PYTHON_POSTINGS: Final = 800  # a query with at most this many postings is ranked in Python
_DIGITS: Final = frozenset("0123456789")
MIRROR_BYTES: Final = 96_000_000  # units kept, least recently searched out first
NEIGHBOURS_KEPT: Final = 4_096  # per unit
TEXT_CHARS: Final = 16_000_000  # row texts kept, the longest kept out first


def text_terms(text: str) -> tuple[dict[str, int], int]:
    """A text's terms as the index counts them (stems; CJK characters and the bigrams of
    adjacent ones, which a two-character query phrase matches) and its length in tokens.

    The tokens are counted in C where the text allows it (the indexer runs this on every
    message): text whose tokens are ASCII as bytes (letters and digits kept, the rest split
    on); ``porter.fold`` only where a token holds a char it may change; text with CJK
    as its other words plus its CJK characters counted at once, the bigrams found per chain
    of CJK characters with nothing but separators between them."""
    low = text.lower()
    if low.isascii() or _NON_ASCII_TOKEN.search(low) is None:
        # no token holds a non-ASCII char: separators become spaces, tokens are bytes
        found = low.encode("ascii", "replace").translate(_ASCII_TOKENS).split()
        if not found:
            return {}, 0
        counted = Counter(found)  # the distinct ones decoded at once
        names = b" ".join(counted).decode("ascii").split(" ")
        return _stemmed(dict(zip(names, counted.values(), strict=True))), len(found)
    cjk = CJK_RUN.search(low) is not None
    words = WORD.findall(CJK_RUN.sub(" ", low) if cjk else low)
    if _FOLDED_TOKEN.search(low) is not None:  # a token holds a char ``fold`` may change
        words = [t if t.isascii() else fold(t) for t in words]
    counts = _stemmed(Counter(words))
    n = len(words)
    if cjk:  # CJK chars and their bigrams: keys no word has, counted in C
        chars = _NOT_TOKEN.sub("", "".join(CJK_RUN.findall(low)))
        n += len(chars)
        counts.update(Counter(chars))
        pairs: Counter[str] = Counter()
        for chain in _CJK_CHAIN.findall(low):
            chars = _NOT_TOKEN.sub("", chain)
            pairs.update(map(operator.add, chars, chars[1:]))
        counts.update(pairs)
    return counts, n


# A byte of ASCII text: kept when a letter or digit (unicode61's token chars), else a space.
_ASCII_TOKENS: Final = bytes(c if chr(c).isalnum() else 32 for c in range(128)) + bytes(128)
_NOT_TOKEN: Final = re.compile(r"[\W_]+")
_NON_ASCII_TOKEN: Final = re.compile(r"[^\W\x00-\x7f]")  # a non-ASCII letter or digit
# A letter or digit ``porter.fold`` may change (Latin, Greek, Cyrillic).
_FOLDED_TOKEN: Final = re.compile(r"[^\W\x00-\x7f\u0530-\u1dff\u2000-\U0010ffff]")
# Two or more CJK chars with only separators between them: adjacent tokens, so bigrams.
_CJK_CHAIN: Final = re.compile(rf"{CJK}(?:[\W_]*{CJK})+")


def _stemmed(counted: Mapping[str, int]) -> dict[str, int]:
    """Token counts as stem counts (two tokens with one stem add up)."""
    # Porter's rules all end on a letter: a number (most of a long tool result's
    # distinct tokens) is its own stem, and stays out of the stem cache.
    keys = [token if token[-1] in _DIGITS else stem(token) for token in counted]
    if len(set(keys)) == len(keys):
        return dict(zip(keys, counted.values(), strict=True))
    counts: dict[str, int] = {}
    for key, count in zip(keys, counted.values(), strict=True):
        counts[key] = counts.get(key, 0) + count
    return counts


def query_keys(terms: Iterable[str]) -> list[str]:
    """Each query phrase (``terms.search_terms``) as the key ``text_terms`` counts it under;
    a phrase twice (two words with one stem) counts twice, as in FTS5. Each phrase's key
    is found once (a question's words mostly repeat the last ones')."""
    keys = []
    for term in terms:
        key = _query_keys.get(term)
        if key is None:
            found = tokens(index_terms(term))
            if len(found) == 1:
                key = stem(found[0])
            elif len(found) == 2:
                key = found[0] + found[1]
            else:
                key = ""
            if len(_query_keys) >= QUERY_KEYS_KEPT:
                _query_keys.clear()
            _query_keys[term] = key
        if key:
            keys.append(key)
    return keys


QUERY_KEYS_KEPT: Final = 65_536
_query_keys: dict[str, str] = {}  # query phrase → its key ("" for none)


class _Unit:
    """One user's rows (or one session's): the inverted index and what rows carry."""

    def __init__(self, neighbours: Sequence[int] = (-1, 1)) -> None:
        self.neighbours = tuple(neighbours)
        self.last = 0  # highest row id held
        self.ids = array("q")
        self.positions = array("q")
        self.codes = array("i")  # session number, into ``names``
        self.lengths = array("d")
        self.rows: list[tuple[int, str, str, str]] = []  # (session number, role, dated, digest)
        self.names: list[str] = []
        self.numbers: dict[str, int] = {}
        # term → its rows and counts, each ``row << 20 | count``: an int for one row
        self.postings: dict[str, int | array[int]] = {}
        self.at: dict[tuple[int, int], int] = {}  # (session number, position) → newest row
        self.total = 0.0
        self.bytes = 0
        self.made: dict[int, IndexedMessage] = {}  # row → as a neighbour
        # row → it as a hit and its neighbours by (session, position), made once: the same
        # rows come back as hits turn after turn (see ``RecallMirror.search``)
        self.near: dict[int, tuple[IndexedMessage, Neighbours]] = {}

    def add(
        self, message: IndexedMessage, owned: bool, text_counts: dict[str, int], n: int
    ) -> None:
        row = len(self.ids)
        code = self.numbers.get(message.session_id)
        if code is None:
            code = self.numbers[message.session_id] = len(self.names)
            self.names.append(message.session_id)
        length = n + 1 + owned  # FTS5 counts the scope column's tokens in the row's length
        self.ids.append(message.id)
        self.positions.append(message.position)
        self.codes.append(code)
        self.lengths.append(float(length))
        self.rows.append((code, message.role, message.dated, message.digest))
        self.total += length
        self.last = max(self.last, message.id)
        held = self.at.get((code, message.position))
        if held is None or self.ids[held] < message.id:
            if held is not None:  # superseded: kept in ``near`` no more (see ``_assemble``)
                self.near.pop(held, None)
            self.at[(code, message.position)] = row
            for offset in self.neighbours:  # rows this one is now the neighbour of
                self.near.pop(self.at.get((code, message.position - offset), -1), None)
        postings = self.postings
        shifted = row << _COUNT_BITS
        for key, count in text_counts.items():
            entry = shifted | min(count, _COUNT_MAX)
            posting = postings.get(key)
            if posting is None:  # most terms (numbers, ids) occur in one row: no array
                postings[key] = entry
            elif type(posting) is int:
                postings[key] = array("q", (posting, entry))
            else:
                posting.append(entry)  # type: ignore[union-attr]
        self.bytes += 90 * len(text_counts) + 160

    def rank(
        self,
        keys: Sequence[str],
        *,
        session_id: str,
        visible_from: int,
        shown: Sequence[int],
        limit: int,
    ) -> list[tuple[int, float]]:
        """The best ``limit`` rows (row number, BM25 as FTS5 gives it: lower is better),
        ordered by score then newest first, without this session's rows the view shows."""
        n = len(self.ids)
        if not n:
            return []
        terms = []  # (posting, its term's weight: idf × (k1 + 1) × times in the query)
        size = 0
        for key, times in Counter(keys).items():
            posting = self.postings.get(key)
            if posting is None:
                continue
            count = 1 if type(posting) is int else len(posting)  # type: ignore[arg-type]
            idf = math.log((n - count + 0.5) / (count + 0.5))
            terms.append((posting, times * (idf if idf > 0 else IDF_FLOOR) * (K1 + 1.0)))
            size += count
        if not size:
            return []
        scale = K1 * B * n / self.total
        if size <= PYTHON_POSTINGS:
            return self._rank_few(terms, scale, session_id, visible_from, shown, limit)
        # Every posting of every query term in one buffer, each entry's term weight beside
        # it, joined in C (arrays extend and repeat without numpy): a turn's ranking is a
        # fixed count of numpy calls, whatever the query's length (each ~1-3 µs).
        entries = array("q")
        weights = array("d")
        for posting, weight in terms:
            if type(posting) is int:
                entries.append(posting)
                weights.append(weight)
            else:
                entries.extend(posting)  # type: ignore[arg-type]
                weights.extend(array("d", (weight,)) * len(posting))  # type: ignore[arg-type]
        packed = np.frombuffer(entries, dtype=np.int64)
        rows = packed >> _COUNT_BITS
        freq = (packed & _COUNT_MAX).astype(np.float64)
        # BM25's length norm, K1 * (1 - B + B * length / mean length), as a + b * length
        norm = np.frombuffer(self.lengths, dtype=np.float64)[rows] * scale + K1 * (1.0 - B)
        each = np.frombuffer(weights, dtype=np.float64) * freq / (freq + norm)
        scores = np.bincount(rows, weights=each, minlength=n)
        found = scores.nonzero()[0]
        code = self.numbers.get(session_id)
        if code is not None:  # this session's rows the view shows are not recalled
            positions = np.frombuffer(self.positions, dtype=np.int64)[found]
            codes = np.frombuffer(self.codes, dtype=np.int32)[found]
            hidden = (codes == code) & (positions >= visible_from)
            if shown:  # shown as a placeholder or preview: recalled after all
                # Sorted is enough for searchsorted (np.unique's first call imports
                # numpy.ma: 10-90 ms on a process's first recall turn).
                held = np.sort(np.asarray(shown, dtype=np.int64))
                at = np.minimum(held.searchsorted(positions), len(held) - 1)
                hidden &= held[at] != positions
            found = found[~hidden]
        best = scores[found]
        if len(found) > limit:  # only rows scoring at least the limit-th best can be in it
            cut = np.partition(best, len(best) - limit)[len(best) - limit]
            kept = best >= cut
            found, best = found[kept], best[kept]
        # Best first, then newest (row ids are unique: no two tuples tie); sorted in Python,
        # a few dozen rows, where numpy's lexsort and the arrays around it took ~6 calls.
        chosen = found.tolist()
        ids = self.ids
        found_ids = [ids[row] for row in chosen]
        ranked = sorted(zip(best.tolist(), found_ids, chosen, strict=True), reverse=True)
        return [(row, -score) for score, _, row in ranked[:limit]]

    def _rank_few(
        self,
        terms: Sequence[tuple[int | array[int], float]],
        scale: float,
        session_id: str,
        visible_from: int,
        shown: Sequence[int],
        limit: int,
    ) -> list[tuple[int, float]]:
        """``rank`` for a query whose terms have few postings, in Python: the same sums in
        the same order (identical floats), without numpy's ~30 calls. Those cost ~50 µs
        when warm, but a proxy's turn comes after other work has pushed numpy out of the
        CPU's caches, and then ~235 µs against ~130 µs for this loop (``make bench``'s
        proxy, ~400 postings a turn), which also leaves out the view's rows before scoring
        them instead of after."""
        lengths, codes, positions, ids = self.lengths, self.codes, self.positions, self.ids
        base = K1 * (1.0 - B)
        scores: dict[int, float] = {}
        get = scores.get
        code = self.numbers.get(session_id)
        held = set(shown)
        for posting, weight in terms:
            for entry in (posting,) if type(posting) is int else posting:  # type: ignore[union-attr]
                row = entry >> _COUNT_BITS
                # This session's rows the view shows are not recalled (shown ones are): most
                # of a turn's postings (~90% in the demo's session), passed over unscored.
                if (
                    codes[row] == code
                    and positions[row] >= visible_from
                    and positions[row] not in held
                ):
                    continue
                count = entry & _COUNT_MAX
                score = weight * count / (count + (lengths[row] * scale + base))
                scores[row] = get(row, 0.0) + score
        found = [(score, ids[row], row) for row, score in scores.items() if score]
        found.sort(reverse=True)  # best first, then newest (ids are unique: no ties)
        return [(row, -score) for score, _, row in found[:limit]]

    def unscored(self, row: int, content: str) -> IndexedMessage:
        """The row without a score (a neighbour, or a hit whose score is not wanted), made
        once: the same ones come back each turn."""
        made = self.made.get(row)
        if made is None or made.content is not content:
            made = self.made[row] = self.message(row, content)
            if len(self.made) > NEIGHBOURS_KEPT:
                self.made.clear()
        return made

    def message(self, row: int, content: str, score: float = 0.0) -> IndexedMessage:
        code, role, dated, digest = self.rows[row]
        return IndexedMessage(
            session_id=self.names[code],
            position=self.positions[row],
            role=role,
            content=content,
            dated=dated,
            digest=digest,
            id=self.ids[row],
            score=score,
        )


Found = tuple[list[IndexedMessage], dict[tuple[str, int], IndexedMessage]]
Neighbours = tuple[tuple[tuple[str, int], IndexedMessage], ...]


def _keys(user_id: str | None, session_id: str) -> tuple[tuple[str, str], ...]:
    """The units a row of this user and session belongs in."""
    return (("u", user_id), ("s", session_id)) if user_id else (("s", session_id),)


class RecallMirror:
    """Units (a user's rows, or a session's without a user) kept in step with the store,
    least recently searched dropped beyond ``max_bytes``; thread-safe."""

    def __init__(
        self,
        store: RecallIndex,
        *,
        max_bytes: int = MIRROR_BYTES,
        text_chars: int = TEXT_CHARS,
        neighbours: Sequence[int] = (-1, 1),
    ) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self.text_chars = text_chars
        self.neighbours = tuple(neighbours)
        self._lock = threading.Lock()
        self._units: OrderedDict[tuple[str, str], _Unit] = OrderedDict()
        self._epoch: str | None = None
        self._unowned: dict[str, tuple[int, bool]] = {}  # session → (checked to id, any)
        self._texts: OrderedDict[int, str] = OrderedDict()
        # (session, position, digest) → the row's terms, counted by the indexer before it
        # writes the row: whichever thread reads the row into a unit first needs not count
        self._counted: dict[tuple[str, int, str], tuple[dict[str, int], int]] = {}
        self._chars = 0

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
        scored: bool = True,
    ) -> Found | None:
        """The best hits as the store's ``search_index`` ranks them, and their neighbours
        by (session, position); None when the store must answer (see the module). With
        ``scored`` False the hits carry no score (0.0): the same objects come back each turn
        for the same rows, instead of one made per hit per search."""
        with self._lock:
            top, epoch = self.store.recall_mark()
            if epoch != self._epoch:  # rows went: every copy may hold them
                self._units.clear()
                self._unowned.clear()
                self._epoch = epoch
            if user_id is not None and self._has_unowned(session_id, top):
                return None
            key = ("u", user_id) if user_id is not None else ("s", session_id)
            unit = self._units.get(key)
            if unit is None:
                unit = self._units[key] = _Unit(self.neighbours)
            self._units.move_to_end(key)
            if unit.last < top:
                self._sync(unit, user_id, session_id, searching=True)
                self._bound()
            ranked = unit.rank(
                query_keys(terms),
                session_id=session_id,
                visible_from=visible_from,
                shown=shown,
                limit=limit,
            )
            near = unit.near
            if len(near) + len(ranked) > NEIGHBOURS_KEPT:
                near.clear()
            new = [row for row, _ in ranked if row not in near]
            made = self._assemble(unit, new) if new else near
            hits = []
            around: dict[tuple[str, int], IndexedMessage] = {}
            for row, score in ranked:
                entry = near.get(row) or made.get(row)
                if entry is None:  # another process deleted it since the mark
                    continue  # (its epoch is seen next)
                hit, neighbours = entry
                hits.append(unit.message(row, hit.content, score) if scored else hit)
                around.update(neighbours)
        return hits, around

    def _assemble(
        self, unit: _Unit, rows: Sequence[int]
    ) -> dict[int, tuple[IndexedMessage, Neighbours]]:
        """Each of ``rows`` as a hit with its neighbours, its texts read (cache or store) and
        kept in ``unit.near``, except a row whose text or a neighbour's another process
        deleted (returned, not kept: it is left out, or shown without that neighbour) and a
        row a newer one at its position superseded (``_Unit.add`` keeps ``near`` right by
        dropping the entries of the newest rows next to a row it adds)."""
        wanted: dict[tuple[int, int], int] = {}  # (row, offset) → neighbour row
        for row in rows:
            code, position = unit.rows[row][0], unit.positions[row]
            for offset in self.neighbours:
                near = unit.at.get((code, position + offset))
                if near is not None:
                    wanted[(row, offset)] = near
        texts = self._read([unit.ids[r] for r in (*rows, *wanted.values())])
        made = {}
        for row in rows:
            text = texts.get(unit.ids[row])
            if text is None:
                continue
            name, position = unit.names[unit.rows[row][0]], unit.positions[row]
            whole = True
            neighbours = []
            for offset in self.neighbours:
                near = wanted.get((row, offset))
                if near is None:
                    continue
                near_text = texts.get(unit.ids[near])
                if near_text is None:
                    whole = False
                    continue
                neighbours.append(((name, position + offset), unit.unscored(near, near_text)))
            made[row] = (unit.unscored(row, text), tuple(neighbours))
            if whole and unit.at.get((unit.rows[row][0], position)) == row:
                unit.near[row] = made[row]
        return made

    def refresh(self, user_id: str | None, session_id: str) -> None:
        """Read new rows into the units a write of this user's and session's rows touched,
        if they are held (the indexer calls this after each batch, off the caller's thread).
        After a write of a user's rows, whether the session has rows without a user is
        asked here too, as of the store's mark now: the turn's search then needs not ask
        (a statement a turn on the caller's thread) unless rows came since."""
        with self._lock:
            for key in _keys(user_id, session_id):
                unit = self._units.get(key)
                if unit is not None:
                    self._sync(unit, key[1] if key[0] == "u" else None, session_id)
            self._bound()
            if user_id is not None and session_id in self._unowned:
                self._has_unowned(session_id, self.store.recall_mark()[0])

    @contextlib.contextmanager
    def writing(self, user_id: str | None, rows: Sequence[IndexedMessage]) -> Iterator[None]:
        """Around the store write of ``rows`` (one session's): their terms are counted first,
        outside the lock (a search meanwhile waits for none of it, and one that meets the
        committed rows before the refresh leaves them to it), then the units are refreshed
        with those counts. Only rows a held
        unit does not hold yet are counted: messages that leave a view were mostly indexed
        already, and a unit not held is built whole on its first search."""
        with self._lock:
            wanted = [row for row in rows if self._wanted(user_id, row)]
        counted = {(r.session_id, r.position, r.digest): text_terms(r.content) for r in wanted}
        if counted:
            with self._lock:
                self._counted.update(counted)
        try:
            yield
            if rows:
                self.refresh(user_id, rows[0].session_id)
        finally:
            if counted:
                with self._lock:
                    for key in counted:
                        self._counted.pop(key, None)

    def _wanted(self, user_id: str | None, row: IndexedMessage) -> bool:
        """Whether a held unit would read ``row`` in and does not hold it yet."""
        for key in _keys(user_id, row.session_id):
            unit = self._units.get(key)
            if unit is None:
                continue
            code = unit.numbers.get(row.session_id)
            held = None if code is None else unit.at.get((code, row.position))
            if held is None or unit.rows[held][3] != row.digest:
                return True
        return False

    def _has_unowned(self, session_id: str, top: int) -> bool:
        """Whether the session has rows indexed without a user (a user's search sees them)."""
        checked, found = self._unowned.get(session_id, (0, False))
        if not found and checked < top:
            found = self.store.unowned_since(session_id, checked)
            if len(self._unowned) > 65_536:
                self._unowned.clear()
            self._unowned[session_id] = (top, found)
        return found

    def _sync(
        self, unit: _Unit, user_id: str | None, session_id: str, *, searching: bool = False
    ) -> None:
        """Read the store's rows past ``unit.last`` into the unit. A search (``searching``)
        stops at the first row of a batch the indexer is writing (counted, its refresh still
        to come): the unit answers as it stood before that write, and the refresh, which
        follows at once, reads the batch in off the caller's thread (a long export's
        thousands of terms took the caller ~10 ms)."""
        for message, owned in self.store.indexed_since(
            unit.last, user_id=user_id, session_id=session_id
        ):
            if message.id <= unit.last:
                continue
            counted = self._counted.get((message.session_id, message.position, message.digest))
            if counted is None:
                counts, n = text_terms(message.content)
            elif searching:
                break
            else:
                counts, n = counted
            unit.add(message, owned, counts, n)
            self._keep(message.id, message.content)

    def _bound(self) -> None:
        total = sum(u.bytes for u in self._units.values())
        while total > self.max_bytes and len(self._units) > 1:
            _, old = self._units.popitem(last=False)
            total -= old.bytes

    def _keep(self, row_id: int, text: str) -> None:
        if row_id in self._texts:
            return
        self._texts[row_id] = text
        self._chars += len(text)
        while self._chars > self.text_chars and len(self._texts) > 1:
            _, old = self._texts.popitem(last=False)
            self._chars -= len(old)

    def _read(self, ids: Sequence[int]) -> dict[int, str]:
        """Row texts by id, from the cache or (those it lost) the store. The cache drops
        the texts kept longest ago first, not the least recently read: a lookup moves
        nothing (a turn reads ~90 texts), and one lost is read from the store again."""
        out: dict[int, str] = {}
        missing = []
        texts = self._texts
        for row_id in ids:
            text = texts.get(row_id)
            if text is None:
                missing.append(row_id)
            else:
                out[row_id] = text
        if missing:
            for row_id, text in self.store.indexed_texts(missing).items():
                out[row_id] = text
                self._keep(row_id, text)
        return out

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "units": len(self._units),
                "bytes": sum(u.bytes for u in self._units.values()),
                "text_chars": self._chars,
                "counted": len(self._counted),
            }
