"""Text as full-text search sees it (SQLite FTS5): index terms, query terms, date stamps.

Shared by the memory block's summary excerpts (docs/design.md §9) and the recall index (§9b); a
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

import re
from collections.abc import Sequence
from typing import Final

MAX_QUERY_TERMS: Final = 32

CJK: Final = r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"
_PIECE = re.compile(rf"{CJK}+|(?:(?!{CJK})[^\W_])+")
_IS_CJK = re.compile(CJK)
CJK_RUN = re.compile(f"{CJK}+")
WORD = re.compile(r"[^\W_]+")  # a run of letters and digits (unicode61's token chars)
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
    return text if text.isascii() else CJK_RUN.sub(_spaced, text)


def _spaced(match: re.Match[str]) -> str:
    return " " + "  ".join(match.group(0)) + " "


def search_terms(text: str, *, limit: int = MAX_QUERY_TERMS) -> list[str]:
    """Plain search terms from user text: words (no stopwords), CJK as overlapping bigrams,
    each once, in order, at most ``limit``."""
    terms: dict[str, None] = {}  # insertion-ordered set: a long text stays linear
    for match in _PIECE.finditer(text.casefold()):  # read only as far as the limit needs
        for gram in piece_terms(match.group(0)):
            terms[gram] = None
            if len(terms) >= limit:
                return list(terms)
    return list(terms)


def term_set(text: str) -> set[str]:
    """Every search term of ``text``, unordered (``search_terms`` without its order and
    limit): the words as one set, then each CJK run's bigrams."""
    low = text.casefold()
    pieces = set((_PIECE if _IS_CJK.search(low) else WORD).findall(low))  # the same pieces
    runs = {piece for piece in pieces if not piece.isascii() and _IS_CJK.match(piece)}
    words = {piece for piece in pieces - runs if len(piece) > 1} - STOPWORDS
    return words.union(*map(piece_terms, runs))


def piece_terms(piece: str) -> list[str]:
    """The search terms of one casefolded piece (a CJK run, or a run of other letters and
    digits): the run's bigrams (itself when one char), or the word unless a stopword or one
    char long."""
    if not piece.isascii() and _IS_CJK.match(piece):
        return [piece] if len(piece) == 1 else [piece[i : i + 2] for i in range(len(piece) - 1)]
    return [piece] if len(piece) >= 2 and piece not in STOPWORDS else []


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
