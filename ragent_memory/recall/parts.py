"""A long message by its parts (docs/design.md §9b): paragraphs, list items, headings with what
follows them, and code blocks with the line that leads into them, so an excerpt shows the part
that holds what a question asks, not the message's head and tail.

``Parts.of`` splits once (a ``Memo`` keeps it: the same long hits come back turn after turn);
``Parts.cut`` picks the parts sharing most of a query's stems within a limit, shows them in
their order, and joins two chosen parts with the one between them when it fits (near parts of
one message read as one passage). A part longer than the limit competes by its sentences.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Final

import attrs

from ragent_memory.text.terms import term_set

STEM_CHARS: Final = 5  # terms match by their first chars (a crude stem: paint ~ painting)
GAP: Final = " … "  # between parts not shown next to each other
_FENCE = re.compile(r"^\s*(?:```|~~~)")
_ITEM = re.compile(r"^\s*(?:[-*+•]|\d{1,3}[.)]|#{1,6})\s")  # a list item or a heading
_BREAK = re.compile(r"(?<=[.!?。！？]) ")  # after a sentence end, in folded text


def fold(text: str) -> str:
    """``text`` with each run of whitespace one space, none at its ends."""
    return " ".join(text.split())


def stems_of(text: str) -> frozenset[str]:
    """The first ``STEM_CHARS`` chars of each of ``text``'s search terms."""
    return frozenset(t[:STEM_CHARS] for t in term_set(text))


def split_parts(text: str) -> list[str]:
    """``text``'s parts, each folded: blank lines end a paragraph, a list item or heading
    starts a part, a fenced code block is one part with the line before it (its lead-in)."""
    parts: list[str] = []
    current: list[str] = []
    code = False
    for line in text.splitlines():
        if code:
            current.append(line)
            if _FENCE.match(line):
                parts.append(fold("\n".join(current)))
                current, code = [], False
        elif _FENCE.match(line):
            lead = current[-1:]
            if current[:-1]:
                parts.append(fold("\n".join(current[:-1])))
            current, code = [*lead, line], True
        elif not line.strip() or _ITEM.match(line):
            if current:
                parts.append(fold("\n".join(current)))
            current = [line] if line.strip() else []
        else:
            current.append(line)
    if current:
        parts.append(fold("\n".join(current)))
    return [part for part in parts if part]


def sentences(folded: str) -> list[str]:
    """Folded text cut after each sentence end (``.!?`` and the CJK ones)."""
    return _BREAK.split(folded)


def _joined(pieces: Sequence[str], chosen: Sequence[int]) -> str:
    """The chosen pieces in order, `` … `` where others were left out (and at the ends)."""
    out, previous = [], -1
    for i in chosen:
        if i != previous + 1:
            out.append("…")
        out.append(pieces[i])
        previous = i
    if previous != len(pieces) - 1:
        out.append("…")
    return " ".join(out)


def _best(pieces: Sequence[str], shared: Sequence[int], limit: int) -> list[int]:
    """The pieces sharing most stems (text order among equals) while they fit ``limit``."""
    ranked = sorted(range(len(pieces)), key=shared.__getitem__, reverse=True)
    chosen: list[int] = []
    size = 0
    for i in ranked:
        if size + len(pieces[i]) + 3 <= limit:
            chosen.append(i)
            size += len(pieces[i]) + 3
    return sorted(chosen)


@attrs.frozen
class Parts:
    """A text whitespace-folded and cut into its parts, the stems each holds and all of them."""

    folded: str
    parts: tuple[str, ...]
    stems: tuple[frozenset[str], ...]
    every: frozenset[str]

    @classmethod
    def of(cls, text: str) -> Parts:
        parts = split_parts(text)
        if len(parts) <= 1:  # one paragraph: its sentences are its parts
            parts = sentences(fold(text))
        stems = [stems_of(part) for part in parts]
        return cls(fold(text), tuple(parts), tuple(stems), frozenset().union(*stems))

    def cut(self, limit: int, stems: frozenset[str]) -> str | None:
        """The parts sharing most ``stems`` that fit ``limit`` chars, in their order, a gap of
        one part between two chosen filled when it fits (gaps marked `` … ``); a part longer
        than ``limit`` takes part by its sentences (a long paragraph holding the answer is not
        passed over for a short part sharing fewer words); None when nothing fits."""
        parts: list[str] = []
        shared: list[int] = []
        for part, held in zip(self.parts, self.stems, strict=True):
            if len(part) + 3 <= limit:
                parts.append(part)
                shared.append(len(stems & held))
            else:  # too long to show whole: its sentences compete with the other parts
                pieces = sentences(part)
                parts += pieces
                shared += [len(stems & stems_of(piece)) for piece in pieces]
        chosen = _best(parts, shared, limit - 4)
        if not chosen:
            return None
        size = sum(len(parts[i]) + 3 for i in chosen)
        for a, b in itertools.pairwise(tuple(chosen)):
            if b == a + 2 and size + len(parts[a + 1]) + 1 <= limit:
                size += len(parts[a + 1]) + 1
                chosen.append(a + 1)
        return _joined(parts, sorted(chosen))
