"""A text's search keys as the recall ranker counts them, and a question's: the one reading of
both that every backend's candidates are ranked by (``recall/rank.py``), and that the
PostgreSQL store keeps per row to find its candidates.

- ``text_terms``: a text's keys and their counts, and its length in tokens;
- ``query_keys``: each search term (``terms.search_terms``) as the key it matches;
- ``token_count``: a text's length in tokens, as ``text_terms`` counts it, without the tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ragent_memory.text.porter import BREAKS, stem, tokens
from ragent_memory.text.terms import index_terms, is_cjk


def _stems(words: Sequence[str]) -> list[str]:
    return list(map(stem, words))


def text_terms(
    text: str, stems: Callable[[Sequence[str]], list[str]] = _stems
) -> tuple[dict[str, int], int]:
    """A text's terms as the index counts them and its length in tokens: unicode61's tokens
    of the spaced text (``index_terms``), each stemmed (``stems``: a list's stems; a number
    is its own stem: Porter's rules all end on a letter), and each pair of adjacent single
    CJK characters as a bigram (what a two-character query phrase matches)."""
    found = tokens(spaced := index_terms(text))
    counts: dict[str, int] = {}
    each = Counter(found)
    words = [token for token in each if token[-1] not in "0123456789"]
    keys = dict(zip(words, stems(words), strict=True))
    for token, count in each.items():
        counts[keys.get(token, token)] = counts.get(keys.get(token, token), 0) + count
    previous = ""
    for token in found if len(spaced) > len(text) else ():  # bigrams: a text with CJK only
        single = len(token) == 1 and is_cjk(token)
        if single and previous:
            counts[previous + token] = counts.get(previous + token, 0) + 1
        previous = token if single else ""
    return counts, len(found)


def query_keys(terms: Iterable[str], stem: Callable[[str], str] = stem) -> list[str]:
    """Each query phrase (``terms.search_terms``) as the key ``text_terms`` counts it under
    (a word's stem, a CJK bigram's two chars); a phrase twice (two words with one stem)
    counts twice, as in FTS5."""
    keys = []
    for term in terms:
        found = tokens(index_terms(term))
        if len(found) == 1:
            keys.append(stem(found[0]))
        elif len(found) == 2:
            keys.append(found[0] + found[1])
    return keys


def token_count(terms: str) -> int:
    """How many tokens ``tokens(terms)`` makes (``terms``: a text as indexed, ``index_terms``),
    counted on the bytes for ASCII text (the start of each run of letters and digits) rather
    than by making every token: a row's length, measured as it is indexed."""
    low = terms.lower()
    if not low.isascii():
        return len(tokens(terms))
    word = np.frombuffer(low.encode().translate(BREAKS), dtype=np.uint8) != ord(" ")
    if not len(word):
        return 0
    return int(word[0]) + int(np.count_nonzero(word[1:] & ~word[:-1]))
