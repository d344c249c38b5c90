"""Identifiers in text (docs/design.md §6 "Retention check"): the values a summary must not lose.

Numbers with a unit or a currency, codes like ``ORD-77341``, e-mail addresses, URLs, paths,
dates and capitalised names, in English and Chinese. Pure functions, no state.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

_EMAIL = r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
_URL = r"https?://[^\s<>\"'）)\]]+"
_PATH = r"(?<![\w/])(?:~|\.{1,2})?(?:/[\w.@-]+){2,}/?"
_CODE = r"\b[A-Z][A-Z0-9]*[-_#]?\d[A-Z0-9]*(?:[-_][A-Z0-9]+)*\b|\b[A-Z]{2,}-[A-Z0-9]+\b"
_MONTHS = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
_DATE = (
    r"\b\d{4}-\d{1,2}-\d{1,2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b"
    rf"|\b\d{{1,2}}\s+{_MONTHS}(?:,?\s+\d{{4}})?\b|\b{_MONTHS}\s+\d{{1,2}}(?:,?\s+\d{{4}})?\b"
    r"|\d{4}\s*年\s*\d{1,2}\s*月(?:\s*\d{1,2}\s*[日号])?|\d{1,2}\s*月\s*\d{1,2}\s*[日号]"
)
_UNITS = (
    r"%|euros?|eur|dollars?|usd|gbp|rmb|cny|yuan|kg|g|km|m|cm|mm|ml|l|gb|mb|tb|kb|ms|s"
    r"|miles?|hours?|hrs?|h|minutes?|mins?|seconds?|days?|weeks?|months?|years?|items?|units?"
    r"|pages?|people|persons?|users?|rooms?|nights?|tokens?|requests?|pcs|boxes|tons?"
)
_AMOUNT = (
    r"[$€£¥]\s?\d[\d,]*(?:\.\d+)?(?:\s?[kKmM]\b)?"
    rf"|\b\d[\d,]*(?:\.\d+)?\s?(?:[$€£¥]|(?:{_UNITS})\b)"
    r"|\d[\d,]*(?:\.\d+)?\s*(?:元|块|万元|万|千克|公斤|公里|米|天|周|个月|年|小时|分钟|个|件|次|人|页|间|晚|%)"
)
_NAME_WORD = r"[A-Z][a-z]+(?:[-'][A-Z]?[a-z]+)?"
_NAME = rf"\b{_NAME_WORD}(?:\s+{_NAME_WORD})*\b"

_PATTERN = re.compile(
    "|".join(
        f"(?P<{kind}>{pattern})"
        for kind, pattern in (
            ("email", _EMAIL),
            ("url", _URL),
            ("path", _PATH),
            ("date", _DATE),
            ("amount", _AMOUNT),
            ("code", _CODE),
            ("name", _NAME),
        )
    ),
)
_UNIT_CASE = re.compile(_AMOUNT, re.IGNORECASE)

# Capitalised words that are not names: sentence starters, pronouns, weekdays, section words.
_NOT_NAME_WORDS = """a an and are as at be but by can could did do does done for from had has have he her his
    how i if in is it its let me my no none not of ok okay on or our please she so that the
    their then there these they this those to was we were what when where which who why will
    with would yes you your hi hello hey thanks thank sure also next now here user users tool
    tools assistant result results found done dead ends current progress step requests summary
    findings monday tuesday wednesday thursday friday saturday sunday today tomorrow yesterday
"""
_NOT_NAMES = frozenset(_NOT_NAME_WORDS.split())
# ASCII punctuation ends a sentence only before a space or the end: "€4,321.50", "a.b@c.com"
# and "https://x.example/q3" stay whole.
_SENTENCE_END = re.compile(r"(?:[.!?;](?=\s|$)\s*|[。！？；]\s*|\n+)")
_TRAILING = ".,;:!?)]}>'\"，。；：！？）"


def _is_sentence_start(text: str, start: int) -> bool:
    before = text[:start].rstrip(" \t\"'([*-•>")
    return not before or before[-1] in ".!?\n:。！？：]"


def identifiers(text: str) -> list[str]:
    """The identifiers in ``text``, in order of first appearance, without repeats."""
    found: dict[str, str] = {}
    for match in _PATTERN.finditer(text):
        kind = match.lastgroup or ""
        value = match.group().rstrip(_TRAILING) if kind in ("url", "path") else match.group()
        if kind == "name":
            words = value.split()
            # A lone capitalised word that starts a sentence is just a sentence.
            while words and words[0].lower() in _NOT_NAMES:
                words.pop(0)
            while words and words[-1].lower() in _NOT_NAMES:
                words.pop()
            if not words:
                continue
            is_first = len(words) == 1 and words[0] == value.split()[0]
            if is_first and _is_sentence_start(text, match.start()):
                continue
            value = " ".join(words)
        value = value.strip()
        if len(value) < 2:
            continue
        found.setdefault(normalise(value), value)
    # Amounts written in mixed case ("12 KG") are caught case-insensitively too.
    for match in _UNIT_CASE.finditer(text):
        key = normalise(match.group())
        if not any(key in seen for seen in found):
            found[key] = match.group().strip()
    return list(found.values())


def normalise(value: str) -> str:
    """The form two mentions of one identifier share: case, spacing, thousands separators."""
    value = re.sub(r"\s+", " ", value.casefold()).strip()
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", value)


def kept_in(identifier: str, text: str) -> bool:
    return normalise(identifier) in normalise(text)


def lost(wanted: Iterable[str], summary: str) -> list[str]:
    """Those of ``wanted`` that ``summary`` does not mention."""
    flat = normalise(summary)
    return [i for i in wanted if normalise(i) not in flat]


def sentences(text: str) -> list[str]:
    """``text`` split into sentences (en and zh punctuation, line breaks)."""
    bounds = [0, *(match.end() for match in _SENTENCE_END.finditer(text)), len(text)]
    return [part for a, b in itertools.pairwise(bounds) if (part := text[a:b].strip())]


class Sentences:
    """The sentences of ``texts``, split and normalised once (on first use of each text),
    so many identifiers can be looked up without re-reading the material for each."""

    def __init__(self, texts: Iterable[str]) -> None:
        self._texts = list(texts)
        self._split: dict[int, list[tuple[str, str]]] = {}

    def shortest(self, identifier: str) -> str | None:
        """The shortest sentence holding ``identifier`` in the first text that has one."""
        found = self.find(identifier)
        return None if found is None else found[1]

    def find(self, identifier: str) -> tuple[int, str] | None:
        """The index of the first text holding ``identifier`` and its shortest sentence
        holding it."""
        key = normalise(identifier)
        for index, text in enumerate(self._texts):
            if index not in self._split:
                self._split[index] = [(s, normalise(s)) for s in sentences(text)]
            holding = [s for s, flat in self._split[index] if key in flat]
            if holding:
                return index, min(holding, key=len)
        return None
