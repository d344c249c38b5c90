"""What a model extractor learns from (DESIGN §9, issue 34): the user's messages as the offline
extractor's gates leave them (``clauses``: no questions, hypotheticals, reported, quoted or
pasted text, role play or transient states), and only the facts grounded in that.

A small model copies whole sentences, a question or someone else's words included; the gates
that keep those from the offline extractor keep them from the model too. A message with
nothing left is not sent at all. A fact the model returns stays only when it is grounded: it
shares a content word with what the gates kept, uses no word that only the dropped text holds,
and is not worded as a question or a hypothetical. A fact already known needs no new ground."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from ragent_memory.core.logs import get_logger
from ragent_memory.longterm.clauses import Sentence, is_conjecture, sentences
from ragent_memory.longterm.operations import Parsed
from ragent_memory.longterm.vocabulary import Add, ExtractionRequest, Supersede, normalised
from ragent_memory.text.porter import stem
from ragent_memory.text.terms import term_set

log = get_logger(__name__)

_ENDS = (".", "!", "?", "。", "！", "？", "；", ";")


def stems(text: str) -> set[str]:
    """The stemmed search terms of ``text`` (CJK as bigrams)."""
    return {stem(term) for term in term_set(text)}


def _ended(text: str, language: str) -> str:
    text = text.strip()
    return text if text.endswith(_ENDS) else text + ("。" if language == "zh" else ".")


def _kept(sentence: Sentence) -> list[str]:
    if not sentence.clauses:
        return []
    if sentence.whole:
        return [_ended(sentence.text, sentence.language)]
    return [_ended(clause, sentence.language) for clause in sentence.clauses]


def gated(message: str) -> str:
    """What the gates leave of one user message: the sentences that may state a fact (only
    their kept clauses when one was left out), lead-ins off; "" when nothing is left."""
    return " ".join(part for sentence in sentences(message) for part in _kept(sentence))


def _union(texts: Iterable[str]) -> frozenset[str]:
    return frozenset().union(*map(stems, texts))


@attrs.frozen
class Grounds:
    """One extraction request's messages as the gates leave them, and what a fact may rest on."""

    messages: tuple[str, ...]  # each non-empty gated message, in order
    said: frozenset[str]  # stems of what the gates kept
    unsaid: frozenset[str]  # stems only the dropped text holds
    known: frozenset[str]  # the active facts, normalised

    @classmethod
    def of(cls, request: ExtractionRequest) -> Grounds:
        kept = tuple(text for text in map(gated, request.messages) if text)
        said = _union(kept)
        return cls(
            messages=kept,
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
        return bool(words & self.said) and not words & self.unsaid


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
