"""Text as full-text search sees it (SQLite FTS5): index terms, query terms, date stamps.

Shared by the memory block's summary excerpts (DESIGN §9) and the recall index (§9b); a
bottom-layer module that imports nothing of the package.

- ``index_terms``: CJK characters spaced apart, so FTS5's ``unicode61`` tokenizer sees each as
  a token (it would take a whole run of them for one word). A query then matches Chinese by
  character bigrams written as two-token phrases.
- ``search_terms`` / ``fts_query``: plain terms from user text (no stopwords, CJK bigrams)
  joined as quoted phrases, so nothing of FTS5's query syntax survives from user text.
- ``date_stamp``: the date a message is stamped with (a date near its start, the way chat
  apps prefix a session), carried to the later messages of the session as their time context.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from operator import itemgetter
from typing import Final

MAX_QUERY_TERMS: Final = 32

CJK: Final = r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"
_PIECE = re.compile(rf"{CJK}+|(?:(?!{CJK})[^\W_])+")
_IS_CJK = re.compile(CJK)
CJK_RUN = re.compile(f"{CJK}+")
WORD = re.compile(r"[^\W_]+")  # a run of letters and digits (unicode61's token chars)
_LONG_WORD = re.compile(r"[^\W_]{2,}")  # such a run of two or more (runs are maximal)
_FAST_CHARS: Final = 4_000  # longer texts are read only as far as the limit needs
_ENGLISH_STOPWORDS = (
    "a an and are as at be but by can could did do does for from had has have how i if in is it"
    " its me my no not of on or our please so than that the their them then there these they"
    " this to too us was we were what when where which who why will with would you your"
)
STOPWORDS: Final = frozenset(_ENGLISH_STOPWORDS.split())


def is_cjk(char: str) -> bool:
    """``char`` is a CJK character (indexed as a token of its own)."""
    return _IS_CJK.match(char) is not None


def index_terms(text: str) -> str:
    """``text`` as indexed: CJK characters spaced apart (one token each): each becomes
    `` c `` (a run replaced at once, not one callback per character)."""
    return CJK_RUN.sub(_spaced, text)


def _spaced(match: re.Match[str]) -> str:
    return " " + "  ".join(match.group(0)) + " "


def search_terms(text: str, *, limit: int = MAX_QUERY_TERMS) -> list[str]:
    """Plain search terms from user text: words (no stopwords), CJK as overlapping bigrams,
    each once, in order, at most ``limit``."""
    if len(text) <= _FAST_CHARS and _IS_CJK.search(text) is None:  # the same terms, in C
        words = dict.fromkeys(_LONG_WORD.findall(text.casefold()))
        return [w for w in words if w not in STOPWORDS][:limit]
    terms: dict[str, None] = {}  # insertion-ordered set: a long text stays linear
    for match in _PIECE.finditer(text.casefold()):  # read only as far as the limit needs
        piece = match.group(0)
        if _IS_CJK.match(piece):
            grams = (
                [piece] if len(piece) == 1 else [piece[i : i + 2] for i in range(len(piece) - 1)]
            )
        elif len(piece) >= 2 and piece not in STOPWORDS:
            grams = [piece]
        else:
            continue
        for gram in grams:
            terms[gram] = None
            if len(terms) >= limit:
                return list(terms)
    return list(terms)


def term_prefixes(text: str, chars: int, *, limit: int = MAX_QUERY_TERMS) -> frozenset[str]:
    """``{t[:chars] for t in search_terms(text, limit=limit)}``, found as sets in C when the
    text holds at most ``limit`` distinct terms (then the order that picks the first ones is
    moot)."""
    if len(text) <= _FAST_CHARS and _IS_CJK.search(text) is None:
        words = set(_LONG_WORD.findall(text.casefold()))
        words -= STOPWORDS
        if len(words) <= limit:
            return frozenset(map(itemgetter(slice(0, chars)), words))
    return frozenset(t[:chars] for t in search_terms(text, limit=limit))


def plain_words(text: str) -> str | None:
    """``text.casefold()`` when ``term_prefixes`` reads each part of it cut at spaces (up
    to ``plain_chars`` long) as a set of words, its fast path: no CJK, and casefold keeps
    every char one char (positions in it are positions in ``text``). None otherwise."""
    if _IS_CJK.search(text) is not None:
        return None
    low = text.casefold()
    return low if len(low) == len(text) else None


def plain_chars(limit: int) -> int:
    """The longest text ``term_prefixes`` always reads as a set of words: within the fast
    path's length, and too short to hold more than ``limit`` words of two chars or more
    (n of them take 3n - 1 chars)."""
    return min(_FAST_CHARS, 3 * limit + 1)


def word_prefixes(low: str, chars: int) -> frozenset[str]:
    """What ``term_prefixes`` gives for the casefolded ``low`` on its fast path, whatever
    the count of words (words all ASCII are split as bytes, in C: the regex took ~0.3 ms
    per 2,500 chars)."""
    if low.isascii() or not any(map(str.isalnum, set(_ASCII_RUN.sub("", low)))):  # ASCII words
        raw = low.encode("ascii", "replace").translate(_ASCII_WORDS).split()
        words = {w.decode() for w in set(raw) if len(w) > 1}
    else:
        words = set(_LONG_WORD.findall(low))
    words -= STOPWORDS
    return frozenset(map(itemgetter(slice(0, chars)), words))


# An ASCII byte: kept when a letter or digit (a word char but ``_``), else a space.
_ASCII_WORDS: Final = bytes(c if chr(c).isalnum() else 32 for c in range(128)) + bytes(128)
_ASCII_RUN = re.compile(r"[\x00-\x7f]+")  # what is left holds the non-ASCII chars
_WORD_REST = re.compile(r"[^\W_]*")


def prefix_positions(low: str, prefix: str, chars: int) -> list[int]:
    """Where the words of the casefolded ``low`` start whose first ``chars`` chars are
    ``prefix`` (stopwords aside): the words ``word_prefixes`` maps to ``prefix``. Found by
    a plain substring search, each find checked for a word start (a look-behind in the
    pattern made the search try every position). A word found is read whole only when
    ``prefix`` begins a stopword (most query stems begin none); a shorter prefix is a word
    of its own, a stopword or not."""
    if not 2 <= len(prefix) <= chars or not prefix.isalnum():
        return []  # no word of two chars or more begins so
    size = len(prefix)
    whole = size < chars  # then only the word ``prefix`` itself is its prefix
    if whole and prefix in STOPWORDS:
        return []
    check = not whole and prefix in _stop_prefixes(chars)
    out = []
    at = low.find(prefix)
    while at >= 0:
        end = at + size
        if at == 0 or not low[at - 1].isalnum():
            if whole:
                if end == len(low) or not low[end].isalnum():
                    out.append(at)
            elif not check or low[at : _WORD_REST.match(low, end).end()] not in STOPWORDS:  # type: ignore[union-attr]
                out.append(at)
        at = low.find(prefix, end)  # no word starts inside this one
    return out


@functools.cache
def _stop_prefixes(chars: int) -> frozenset[str]:
    """The first ``chars`` chars of each stopword that long or longer."""
    return frozenset(word[:chars] for word in STOPWORDS if len(word) >= chars)


def fts_query(terms: Sequence[str]) -> str:
    """An FTS5 query matching any of ``terms`` (each a quoted phrase)."""
    return " OR ".join('"' + " ".join(index_terms(t).split()) + '"' for t in terms)


# ---------------------------------------------------------------------------- date stamps

_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_DATE = re.compile(
    rf"\b\d{{1,2}}(?:st|nd|rd|th)?\s+{_MONTH}\.?,?\s+\d{{4}}\b"  # 8 May, 2023
    rf"|\b{_MONTH}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}\b"  # May 8, 2023
    r"|\b\d{4}-\d{2}-\d{2}\b"  # 2023-05-08
    r"|\d{4}\s*年\s*\d{1,2}\s*月(?:\s*\d{1,2}\s*[日号])?",  # 2023年5月8日
    re.IGNORECASE,
)
STAMP_WINDOW_CHARS: Final = 80  # a date this near the start stamps the message


def date_stamp(text: str) -> str:
    """The date ``text`` is stamped with ("" for none): a date within its first 80 chars.

    A date further in ("my exam is on 3 June 2024") is content, not the message's time.
    """
    match = _DATE.search(text[:STAMP_WINDOW_CHARS])
    return " ".join(match.group(0).split()) if match else ""
