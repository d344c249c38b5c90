"""Top-k BM25 that reads a bounded share of the postings: block-max early termination.

The technique is block-max (Ding & Suel, "Faster top-k document retrieval using block-max
indexes", SIGIR 2011) over row-id ranges aligned across terms (Dimopoulos, Nepomnyachiy &
Suel, "A candidate filtering mechanism for fast top-k query processing", WSDM 2013), with
MaxScore's split of a query's terms (Turtle & Flood, "Query evaluation: strategies and
optimizations", IP&M 1995), with room for an anytime budget (Mackenzie, Petri & Moffat,
"Anytime ranking on document-ordered indexes", TOIS 2022) that is off by default:

- the rare terms are read whole: every term in ``LONG`` rows or fewer, then the rarest long
  ones while their postings fit ``WHOLE_POSTINGS``; each row they hold is scored exactly (the
  other terms' counts found by binary search);
- each other term keeps, per block of ``BLOCK_ROWS`` consecutive rows that holds it, where
  its postings for the block start, the largest count and the shortest row among them. A
  block's upper bound is the sum over those terms of BM25 at that count and length (BM25
  rises with the count and falls with the length, so no row of the block scores more);
- blocks are read best bound first, newest first among equal bounds, and reading stops at the
  first block whose bound cannot beat the k-th best found (an equal score wins only when
  newer: the ranking's tie order), or after ``BUDGET_BLOCKS`` blocks;
- once a k-th best is known, MaxScore prunes twice: a block's rows are taken only from the
  essential terms' postings (the weakest terms, whose largest scores summed stay below the
  k-th best, cannot lift a row holding nothing else: a term in most rows, its idf floored,
  is only looked up, never read), and each candidate's other terms are looked up strongest
  first, a row dropped as soon as what it has plus the most the terms left can add falls
  below the k-th best. The rows the rare terms hold are pruned the same way, after the best
  k of them by what those terms give are scored for a first k-th best.

Stopped by the bounds, the top-k is exact: the same rows and scores as scoring every posting.
The default budget never stops it: a budget small enough to save time loses more of the exact
top-k than the recall@k of 0.99 ranking is held to (docs/performance.md, "Why the code is
so"), so a question of common words alone still reads every block of its essential terms,
and its lookups grow with them: its cost grows with the history (the worst case), while a
question with a rare word stops at its bounds. Besides the blocks read, a query reads
``LONG`` postings per short term, ``WHOLE_POSTINGS``, and one bound per long term and block
(a vector of rows ÷ ``BLOCK_ROWS``, which grows with the history).
Scores are summed over the query's terms in one order everywhere (candidates, block rows and
bounds), so equal rows score bit-identically and ties resolve as the exhaustive sum does.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

K1: Final = 1.2
B: Final = 0.75
COUNT_BITS: Final = 20
COUNT_MAX: Final = (1 << COUNT_BITS) - 1  # a term's count in one row, capped (FTS5's is not)
BLOCK_ROWS: Final = 128  # rows per block
LONG: Final = 64  # a term in more rows than this keeps block bounds; fewer are read whole
FIRST_BLOCKS: Final = 8  # blocks read in the first round (doubling each round)
WHOLE_POSTINGS: Final = 8_192  # the rarest long terms are read whole while their postings fit
BUDGET_BLOCKS: Final = 1 << 30  # blocks read at most: none by default, so top-k is exact
DENSE: Final = 8  # a long term in 1/8 of the rows or more keeps its count per row (``Term``)
SATURATED: Final = 255  # a kept count of this many or more: the postings say how many

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
# rows (sorted) → a mask of those the caller may see
Visible = Callable[[Ints], npt.NDArray[np.bool_]]


class Blocks:
    """A long term's block bounds: for each block holding the term (ascending), the index of
    its first posting there, and the largest count and the shortest row length among them."""

    __slots__ = ("blocks", "counts", "shortest", "starts")

    def __init__(self) -> None:
        self.blocks = array("i")
        self.starts = array("i")
        self.counts = array("i")
        self.shortest = array("i")

    def add(self, row: int, index: int, count: int, length: int) -> None:
        """The term's posting ``index`` (row ``row``, ``count`` times, ``length`` tokens)."""
        block = row // BLOCK_ROWS
        if self.blocks and self.blocks[-1] == block:
            self.counts[-1] = max(self.counts[-1], count)
            self.shortest[-1] = min(self.shortest[-1], length)
        else:
            self.blocks.append(block)
            self.starts.append(index)
            self.counts.append(count)
            self.shortest.append(length)

    def nbytes(self) -> int:
        """What it holds in memory (its arrays' buffers, their headers and its own)."""
        arrays = (self.blocks, self.starts, self.counts, self.shortest)
        return sys.getsizeof(self) + sum(map(sys.getsizeof, arrays))


class Term(NamedTuple):
    """One query term: its BM25 weight (idf × k1 + 1 × times asked), postings (each
    ``row << COUNT_BITS | count``, by row), block bounds (None: a short term) and, for a
    term in ``1/DENSE`` of the rows or more, its count in each row up to the last holding it
    (``SATURATED`` at most; one byte a row, no more than its postings' eight bytes each):
    a row's count is then one read, not a binary search in postings that grow with the
    history (None: looked up in the postings)."""

    weight: float
    postings: Ints
    blocks: Blocks | None
    counts: npt.NDArray[np.uint8] | None = None


class Norm(NamedTuple):
    """BM25's length norm, ``K1 * (1 - B + B * length / mean length)``, over the rows."""

    lengths: Floats
    scale: float  # K1 * B / mean length
    base: float  # K1 * (1 - B)


def _looked_up(postings: Ints, rows: Ints) -> Ints:
    """Each row's count in ``postings`` (0: not there), by binary search (rows sorted)."""
    at = np.minimum(postings.searchsorted(rows << COUNT_BITS), len(postings) - 1)
    found = postings[at]
    counts: Ints = np.where((found >> COUNT_BITS) == rows, found & COUNT_MAX, 0)
    return counts


def _counts(term: Term, rows: Ints) -> Ints:
    """``term``'s count in each of ``rows`` (sorted): one read each from its counts per row
    if it keeps them (a saturated one looked up in its postings), else looked up."""
    dense = term.counts
    if dense is None:
        return _looked_up(term.postings, rows)
    inside = rows < len(dense)
    counts = np.zeros(len(rows), dtype=np.int64)
    counts[inside] = dense[rows[inside]]
    full = np.flatnonzero(counts == SATURATED)
    if len(full):
        counts[full] = _looked_up(term.postings, rows[full])
    return counts


def _part(term: Term, rows: Ints, lengths: Floats) -> Floats:
    """What ``term`` adds to each row's BM25 (rows sorted; ``lengths`` their length norm)."""
    freq = _counts(term, rows).astype(np.float64)
    part: Floats = term.weight * freq / (freq + lengths)
    return part


def _score(terms: Sequence[Term], rows: Ints, norm: Norm) -> Floats:
    """Each row's BM25 over ``terms`` (rows sorted), summed in the terms' order."""
    total = np.zeros(len(rows), dtype=np.float64)
    lengths = norm.lengths[rows] * norm.scale + norm.base
    for term in terms:
        total += _part(term, rows, lengths)
    return total


def _promising(
    terms: Sequence[Term],
    tops: Floats,
    rows: Ints,
    norm: Norm,
    threshold: float | None,
    have: Floats | None = None,
) -> Ints:
    """Which of ``rows`` (their indexes) may still reach ``threshold``, given what they
    have (``have``, else nothing) and what ``terms`` add: the terms looked up strongest
    first, a row dropped once what it has plus the most the terms left can add falls below
    it (MaxScore's partial scores; a 1e-9 margin keeps float sums on the safe side)."""
    at = np.arange(len(rows))
    if threshold is None:
        return at
    lengths = norm.lengths[rows] * norm.scale + norm.base
    have = np.zeros(len(rows), dtype=np.float64) if have is None else have
    left = float(tops.sum())
    for i in [*np.argsort(-tops, kind="stable").tolist(), None]:
        kept = (have + max(left, 0.0)) * (1 + 1e-9) >= threshold
        at, rows, have, lengths = at[kept], rows[kept], have[kept], lengths[kept]
        if i is None or not len(at):
            break
        left -= float(tops[i])
        have = have + _part(terms[i], rows, lengths)
    return at


def _whole(terms: Sequence[Term], norm: Norm) -> tuple[Ints, Floats]:
    """The rows holding any of ``terms`` (sorted) and their BM25 over them, each row's sum
    in the terms' order (a stable sort keeps it)."""
    postings = np.concatenate([t.postings for t in terms])
    weights = np.repeat([t.weight for t in terms], [len(t.postings) for t in terms])
    order = np.argsort(postings >> COUNT_BITS, kind="stable")
    postings, weights = postings[order], weights[order]
    rows = postings >> COUNT_BITS
    freq = (postings & COUNT_MAX).astype(np.float64)
    each = weights * freq / (freq + (norm.lengths[rows] * norm.scale + norm.base))
    starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
    return rows[starts], np.add.reduceat(each, starts)


def _sorted_unique(rows: Ints) -> Ints:
    rows = np.sort(rows)
    if len(rows) > 1:
        rows = rows[np.concatenate(([True], rows[1:] != rows[:-1]))]
    return rows


class _Best:
    """The best ``limit`` rows so far (by score, then newest)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.rows: Ints = np.zeros(0, dtype=np.int64)
        self.scores: Floats = np.zeros(0, dtype=np.float64)

    def merge(self, rows: Ints, scores: Floats) -> None:
        rows = np.concatenate((self.rows, rows))
        scores = np.concatenate((self.scores, scores))
        if len(scores) > self.limit:  # only rows scoring at least the limit-th best can be in
            cut = np.partition(scores, len(scores) - self.limit)[len(scores) - self.limit]
            kept = scores >= cut
            rows, scores = rows[kept], scores[kept]
        order = np.lexsort((rows, scores))[::-1][: self.limit]  # best first, newest first
        self.rows, self.scores = rows[order], scores[order]

    def threshold(self) -> float | None:
        """The k-th best score (None until ``limit`` rows are held)."""
        return float(self.scores[-1]) if len(self.rows) >= self.limit else None

    def first_beaten(self, bounds: Floats, blocks: Ints) -> int:
        """Where in ``blocks`` (best bound first, newest first among equals) the first one
        no row of which can enter is: the k-th best scores more than its bound, or as much
        and is newer than every row of it (``len(blocks)``: none)."""
        if len(self.rows) < self.limit:
            return len(blocks)
        worst, row = self.scores[-1], self.rows[-1]
        beaten = (bounds < worst) | ((bounds == worst) & ((blocks + 1) * BLOCK_ROWS <= row))
        at = np.flatnonzero(beaten)
        return int(at[0]) if len(at) else len(blocks)


def _bounds(terms: Sequence[Term], norm: Norm, blocks: int) -> tuple[Floats, Floats]:
    """Each block's upper bound over the long terms, summed in the terms' order, and each
    term's largest (what it adds to a row at most)."""
    bound = np.zeros(blocks, dtype=np.float64)
    tops = np.zeros(len(terms), dtype=np.float64)
    for i, term in enumerate(terms):
        held = term.blocks
        assert held is not None
        counts = np.frombuffer(held.counts, dtype=np.int32).astype(np.float64)
        shortest = np.frombuffer(held.shortest, dtype=np.int32) * norm.scale + norm.base
        each = term.weight * counts / (counts + shortest)
        bound[np.frombuffer(held.blocks, dtype=np.int32)] += each
        tops[i] = each.max()
    return bound, tops


def _essential(terms: Sequence[Term], tops: Floats, threshold: float | None) -> list[Term]:
    """MaxScore's essential terms: all but the weakest, whose largest scores summed stay
    below ``threshold`` (a row holding only those cannot reach the k-th best; a margin of
    1e-9 keeps float sums on the safe side)."""
    if threshold is None:
        return list(terms)
    weakest = np.argsort(tops, kind="stable")
    fewer = int(np.searchsorted(np.cumsum(tops[weakest]) * (1 + 1e-9), threshold))
    left = set(weakest[:fewer].tolist())
    return [term for i, term in enumerate(terms) if i not in left]


def _block_rows(terms: Sequence[Term], batch: Ints) -> Ints:
    """The rows of the blocks ``batch`` that hold a long term (sorted, each once)."""
    pieces = []
    for term in terms:
        held = term.blocks
        assert held is not None
        blocks = np.frombuffer(held.blocks, dtype=np.int32)
        at = np.minimum(blocks.searchsorted(batch), len(blocks) - 1)
        at = at[blocks[at] == batch]
        if not len(at):
            continue
        starts = np.append(np.frombuffer(held.starts, dtype=np.int32), len(term.postings))
        begin, end = starts[at].astype(np.int64), starts[at + 1].astype(np.int64)
        sizes = end - begin
        # the postings of each block: begin..end, as one index vector
        offsets = np.repeat(begin - np.cumsum(sizes) + sizes, sizes)
        pieces.append(term.postings[np.arange(int(sizes.sum())) + offsets] >> COUNT_BITS)
    return _sorted_unique(np.concatenate(pieces)) if pieces else np.zeros(0, dtype=np.int64)


def _without(rows: Ints, held: Ints) -> Ints:
    """``rows`` not in ``held`` (both sorted)."""
    if not len(held) or not len(rows):
        return rows
    at = np.minimum(held.searchsorted(rows), len(held) - 1)
    kept: Ints = rows[held[at] != rows]
    return kept


def _split(terms: Sequence[Term], whole: int) -> tuple[list[Term], list[Term]]:
    """The terms read whole (those without block bounds, then the rarest long ones while
    their postings fit ``whole``) and the rest, each in the query's order (MaxScore's
    essential terms are the rare ones: they carry the most weight)."""
    total, read = 0, set()
    for i in sorted(range(len(terms)), key=lambda i: len(terms[i].postings)):
        size = len(terms[i].postings)
        if terms[i].blocks is None or total + size <= whole:
            read.add(i)
            total += size
    return [t for i, t in enumerate(terms) if i in read], [
        t for i, t in enumerate(terms) if i not in read
    ]


def _first(
    best: _Best, rest: Sequence[Term], tops: Floats, norm: Norm, rows: Ints, have: Floats
) -> None:
    """The rows the terms read whole hold (``have``: their score over those) into ``best``,
    the other terms' counts added: first for the best ``best.limit`` of them by what they
    have (a first k-th best), then for the others that may still beat it."""
    if not rest:
        best.merge(rows, have)
        return
    first = np.zeros(len(rows), dtype=np.bool_)
    first[np.argsort(-have, kind="stable")[: best.limit]] = True
    best.merge(rows[first], have[first] + _score(rest, rows[first], norm))
    later = np.zeros(len(rows), dtype=np.bool_)
    later[_promising(rest, tops, rows, norm, best.threshold(), have)] = True
    later &= ~first
    best.merge(rows[later], have[later] + _score(rest, rows[later], norm))


def top_k(
    terms: Sequence[Term],
    norm: Norm,
    rows: int,
    limit: int,
    visible: Visible,
    budget: int = BUDGET_BLOCKS,
) -> tuple[Ints, Floats]:
    """The best ``limit`` visible rows (by BM25, then newest) and their scores, best first:
    exact when the bounds stop the reading within ``budget`` blocks, else the best of the
    rows read (see the module)."""
    best = _Best(limit)
    read, rest = _split(terms, WHOLE_POSTINGS)
    bound, tops = _bounds(rest, norm, rows // BLOCK_ROWS + 1)
    seen: Ints = np.zeros(0, dtype=np.int64)
    if read:
        seen, scores = _whole(read, norm)
        kept = visible(seen)
        _first(best, rest, tops, norm, seen[kept], scores[kept])
    if not rest:
        return best.rows, best.scores
    held = np.flatnonzero(bound > 0)
    order = held[np.lexsort((held, bound[held]))[::-1]][:budget]  # best bound, then newest
    done, size = 0, FIRST_BLOCKS
    while done < len(order):
        batch = order[done : done + size]
        stop = best.first_beaten(bound[batch], batch)
        essential = _essential(rest, tops, best.threshold())
        if not essential:  # no row left unread can reach the k-th best
            break
        found = _without(_block_rows(essential, np.sort(batch[:stop])), seen)
        found = found[visible(found)]
        found = found[_promising(rest, tops, found, norm, best.threshold())]
        best.merge(found, _score(rest, found, norm))
        if stop < len(batch):
            break
        done, size = done + len(batch), size * 2
    return best.rows, best.scores
