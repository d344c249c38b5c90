"""What a model extractor learns from (docs/design.md §9): the user's messages as the offline
extractor's gates leave them (``clauses``: no questions, hypotheticals, reported, quoted or
pasted text, role play or transient states, and only sentences where the user speaks of
themselves or gives a standing instruction — no one-off request, no small talk), and only the
facts grounded in that.

A small model copies whole sentences, a question or someone else's words included; the gates
that keep those from the offline extractor keep them from the model too. A message with
nothing left is not sent at all. A fact the model returns stays only when it is grounded: it
shares a content word with what the gates kept, uses no word that only the dropped text holds,
and is not worded as a question or a hypothetical. An echo (the user's own words back, "I'm
waiting for the build to finish", "lmao ok") is the model not doing its job, not a fact: it
stays only when the offline patterns read a fact in it or in the sentence it echoes (an
English sentence with only its subject cut, "Type commands, you reply with output", echoes
it). A fact already known needs no new ground."""

from __future__ import annotations

import re
from collections.abc import Iterable

import attrs

from ragent_memory.core.logs import get_logger
from ragent_memory.longterm.clauses import Sentence, is_conjecture, sentences, speaks_of_self
from ragent_memory.longterm.offline import candidates
from ragent_memory.longterm.operations import Parsed
from ragent_memory.longterm.vocabulary import Add, ExtractionRequest, Supersede, normalised
from ragent_memory.text.porter import stem
from ragent_memory.text.terms import term_set

log = get_logger(__name__)

_ENDS = (".", "!", "?", "。", "！", "？", "；", ";")
# A fact still in the user's voice: asked for in the third person, so an echo.
_SUBJECT = r"^(?:i|i'm|im|i've|i'd|i'll|my|me|we|we're|we've|our)\b"
_SPEAKER = re.compile(rf"{_SUBJECT}|^我", re.IGNORECASE)
_LEAD = re.compile(rf"{_SUBJECT}\s*", re.IGNORECASE)  # "I type commands" → "type commands"


def stems(text: str) -> set[str]:
    """The stemmed search terms of ``text`` (CJK as bigrams)."""
    return {stem(term) for term in term_set(text)}


def _ended(text: str, language: str) -> str:
    text = text.strip()
    return text if text.endswith(_ENDS) else text + ("。" if language == "zh" else ".")


def _kept(sentence: Sentence) -> list[str]:
    if not sentence.clauses or not speaks_of_self(sentence):
        return []
    if sentence.whole:
        return [_ended(sentence.text, sentence.language)]
    return [_ended(clause, sentence.language) for clause in sentence.clauses]


def _pieces(message: str) -> list[str]:
    return [part for sentence in sentences(message) for part in _kept(sentence)]


def gated(message: str) -> str:
    """What the gates leave of one user message: the sentences that may state a fact (only
    their kept clauses when one was left out), lead-ins off; "" when nothing is left."""
    return " ".join(_pieces(message))


def _union(texts: Iterable[str]) -> frozenset[str]:
    return frozenset().union(*map(stems, texts))


@attrs.frozen
class Piece:
    """One kept sentence (or clause) of the user's: its words, its comparison key, and
    whether the offline patterns read a fact in it."""

    stems: frozenset[str]
    key: str
    readable: bool

    @classmethod
    def of(cls, text: str) -> Piece:
        return cls(frozenset(stems(text)), normalised(text), bool(candidates(text)))


@attrs.frozen
class Grounds:
    """One extraction request's messages as the gates leave them, and what a fact may rest on."""

    messages: tuple[str, ...]  # each non-empty gated message, in order
    pieces: tuple[Piece, ...]  # their sentences (or clauses)
    said: frozenset[str]  # stems of what the gates kept
    unsaid: frozenset[str]  # stems only the dropped text holds
    known: frozenset[str]  # the active facts, normalised

    @classmethod
    def of(cls, request: ExtractionRequest) -> Grounds:
        kept = [_pieces(message) for message in request.messages]
        pieces = tuple(Piece.of(text) for parts in kept for text in parts)
        said = frozenset().union(*(piece.stems for piece in pieces))
        return cls(
            messages=tuple(" ".join(parts) for parts in kept if parts),
            pieces=pieces,
            said=said,
            unsaid=_union(request.messages) - said,
            known=frozenset(normalised(fact.content) for fact in request.facts),
        )

    def holds(self, content: str) -> bool:
        """``content`` (a fact a model returned) rests on what the user stated."""
        if normalised(content) in self.known:
            return True
        if is_conjecture(content):
            return False
        words = stems(content)
        if not words & self.said or words & self.unsaid:
            return False
        return not self._echoes(content) or self._reads_a_fact(content, words)

    def _echoes(self, content: str) -> bool:
        key = normalised(content)
        if _SPEAKER.match(key) is not None:
            return True
        return any(key in (p.key, _LEAD.sub("", p.key, count=1)) for p in self.pieces)

    def _reads_a_fact(self, content: str, words: set[str]) -> bool:
        """The offline patterns read a fact in an echo, or in the piece it echoes."""
        source = max(self.pieces, key=lambda piece: len(words & piece.stems))
        return source.readable or bool(candidates(content))


def grounded(parsed: Parsed, grounds: Grounds) -> Parsed:
    """``parsed`` without the facts that do not rest on what the user stated (each counted
    as rejected and logged)."""

    def kept(op: object) -> bool:
        return not isinstance(op, Add | Supersede) or grounds.holds(op.content)

    operations = tuple(op for op in parsed.operations if kept(op))
    dropped = len(parsed.operations) - len(operations)
    if dropped:
        log.warning("memory.ungrounded", items=dropped)
    return Parsed(operations, parsed.rejected + dropped)
