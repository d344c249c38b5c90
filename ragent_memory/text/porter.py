"""Search terms as SQLite FTS5's ``porter unicode61 remove_diacritics 2`` tokenizer makes them,
so the in-process recall mirror (``recall/rank.py``) counts exactly what the store's index counts.

- ``tokens``: unicode61's tokens of an indexed text (``terms.index_terms`` already spaced CJK
  characters apart): runs of letters and digits, lower-cased, diacritics removed.
- ``stem``: the Porter stemmer as FTS5 applies it (the rules of Martin Porter's reference
  implementation, on the token's UTF-8 bytes; tokens under 3 or over 64 bytes pass through).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from ragent_memory.text.terms import WORD

MAX_TOKEN_BYTES: Final = 64


# ASCII bytes that are not letters or digits → a space; UTF-8's multi-byte chars kept.
BREAKS: Final = bytes(b if chr(b).isalnum() or b > 127 else 32 for b in range(256))


def tokens(text: str) -> list[str]:
    """unicode61's tokens of ``text``, before stemming, split in C (ASCII separators to spaces,
    then whitespace); only a piece with non-ASCII chars is split by ``WORD`` and folded."""
    low = text.lower()
    spaced = low.encode("utf-8", "surrogatepass").translate(BREAKS)
    pieces = spaced.decode("utf-8", "surrogatepass").split()
    if low.isascii():
        return pieces
    out, at = list[str](), 0
    for i in [i for i, piece in enumerate(pieces) if not piece.isascii()]:
        out += pieces[at:i]
        out += [t if t.isascii() else fold(t) for t in WORD.findall(pieces[i])]
        at = i + 1
    return out + pieces[at:]


_SAME_AS: Final = MappingProxyType(
    {"µ": "μ", "ſ": "s"}
)  # unicode61's folding where lower() differs


def fold(token: str) -> str:
    """A non-ASCII token without its diacritics (remove_diacritics 2), for the Latin, Greek
    and Cyrillic letters; other scripts as they are (close to unicode61, not exact: the
    mirror ranks by what it tokenizes itself, consistently for texts and queries)."""
    out: list[str] = []
    for c in token:
        c = _SAME_AS.get(c, c)
        if ord(c) < 0x530 or 0x1E00 <= ord(c) < 0x2000:
            out.extend(d for d in unicodedata.normalize("NFD", c) if not unicodedata.combining(d))
        else:
            out.append(c)
    return "".join(out)


def _vowel(c: str, y_is_vowel: bool) -> bool:
    return c in "aeiou" or (y_is_vowel and c == "y")


def _gobble(s: str, start: int, prev_cons: bool) -> int:
    """Past one vowel run then one consonant: the index after it, 0 when there is none."""
    cons = prev_cons
    i = start
    n = len(s)
    while i < n:
        cons = not _vowel(s[i], cons)
        if not cons:
            break
        i += 1
    i += 1
    while i < n:
        cons = not _vowel(s[i], cons)
        if cons:
            return i + 1
        i += 1
    return 0


def _m_gt0(s: str) -> bool:
    return _gobble(s, 0, False) != 0


def _m_gt1(s: str) -> bool:
    n = _gobble(s, 0, False)
    return bool(n) and _gobble(s, n, True) != 0


def _m_eq1(s: str) -> bool:
    n = _gobble(s, 0, False)
    return bool(n) and _gobble(s, n, True) == 0


def _ostar(s: str) -> bool:
    if not s or s[-1] in "wxy":
        return False
    mask, cons = 0, False
    for c in s:
        cons = not _vowel(c, cons)
        mask = (mask << 1) + cons
    return (mask & 7) == 5


def _has_vowel(s: str) -> bool:
    return any(_vowel(c, i > 0) for i, c in enumerate(s))


def _s_or_t_m_gt1(s: str) -> bool:
    return bool(s) and s[-1] in "st" and _m_gt1(s)


# (suffix, replacement, condition on the stem) grouped by the word's second-last char; in a
# group the first suffix the word ends with decides, whether its condition holds or not.
_Rule = tuple[str, str, object]
_STEP2: Final[Mapping[str, tuple[_Rule, ...]]] = MappingProxyType(
    {
        "a": (("ational", "ate", _m_gt0), ("tional", "tion", _m_gt0)),
        "c": (("enci", "ence", _m_gt0), ("anci", "ance", _m_gt0)),
        "e": (("izer", "ize", _m_gt0),),
        "g": (("logi", "log", _m_gt0),),
        "l": (
            ("bli", "ble", _m_gt0),
            ("alli", "al", _m_gt0),
            ("entli", "ent", _m_gt0),
            ("eli", "e", _m_gt0),
            ("ousli", "ous", _m_gt0),
        ),
        "o": (("ization", "ize", _m_gt0), ("ation", "ate", _m_gt0), ("ator", "ate", _m_gt0)),
        "s": (
            ("alism", "al", _m_gt0),
            ("iveness", "ive", _m_gt0),
            ("fulness", "ful", _m_gt0),
            ("ousness", "ous", _m_gt0),
        ),
        "t": (("aliti", "al", _m_gt0), ("iviti", "ive", _m_gt0), ("biliti", "ble", _m_gt0)),
    }
)
_STEP3: Final[Mapping[str, tuple[_Rule, ...]]] = MappingProxyType(
    {
        "a": (("ical", "ic", _m_gt0),),
        "s": (("ness", "", _m_gt0),),
        "t": (("icate", "ic", _m_gt0), ("iciti", "ic", _m_gt0)),
        "u": (("ful", "", _m_gt0),),
        "v": (("ative", "", _m_gt0),),
        "z": (("alize", "al", _m_gt0),),
    }
)
_STEP4: Final[Mapping[str, tuple[_Rule, ...]]] = MappingProxyType(
    {
        "a": (("al", "", _m_gt1),),
        "c": (("ance", "", _m_gt1), ("ence", "", _m_gt1)),
        "e": (("er", "", _m_gt1),),
        "i": (("ic", "", _m_gt1),),
        "l": (("able", "", _m_gt1), ("ible", "", _m_gt1)),
        "n": (
            ("ant", "", _m_gt1),
            ("ement", "", _m_gt1),
            ("ment", "", _m_gt1),
            ("ent", "", _m_gt1),
        ),
        "o": (("ion", "", _s_or_t_m_gt1), ("ou", "", _m_gt1)),
        "s": (("ism", "", _m_gt1),),
        "t": (("ate", "", _m_gt1), ("iti", "", _m_gt1)),
        "u": (("ous", "", _m_gt1),),
        "v": (("ive", "", _m_gt1),),
        "z": (("ize", "", _m_gt1),),
    }
)


def _step(word: str, rules: Mapping[str, tuple[_Rule, ...]]) -> str:
    if len(word) < 2:
        return word
    for suffix, replacement, condition in rules.get(word[-2], ()):
        if len(word) > len(suffix) and word.endswith(suffix):
            stem = word[: -len(suffix)]
            return stem + replacement if condition(stem) else word  # type: ignore[operator]
    return word


def _step1a(w: str) -> str:
    """Plurals: sses → ss, ies → i, s → (but ss stays)."""
    if not w.endswith("s"):
        return w
    if w[-2] == "e":
        sses_or_ies = (len(w) > 4 and w[-4:-2] == "ss") or (len(w) > 3 and w[-3] == "i")
        return w[:-2] if sses_or_ies else w[:-1]
    return w if w[-2] == "s" else w[:-1]


def _step1b(w: str) -> str:
    """eed → ee where the stem has a measure; ed and ing go where the stem has a vowel,
    and the stem is then tidied (``_step1b_end``)."""
    if w[-2:-1] == "e":
        if len(w) > 3 and w.endswith("eed"):
            return w[:-1] if _m_gt0(w[:-3]) else w
        if len(w) > 2 and w.endswith("ed") and _has_vowel(w[:-2]):
            return _step1b_end(w[:-2])
    elif w[-2:-1] == "n" and len(w) > 3 and w.endswith("ing") and _has_vowel(w[:-3]):
        return _step1b_end(w[:-3])
    return w


def _step1b_end(w: str) -> str:
    """After ed or ing went: at, bl, iz gain an e; a double consonant (but l, s, z) loses
    one; a short stem (m = 1, cvc) gains an e."""
    if len(w) > 2 and w[-2:] in ("at", "bl", "iz"):
        return w + "e"
    if len(w) >= 2 and not _vowel(w[-1], False) and w[-1] not in "lsz" and w[-1] == w[-2]:
        return w[:-1]
    if _m_eq1(w) and _ostar(w):
        return w + "e"
    return w


def stem(token: str) -> str:
    """``token`` as FTS5's porter tokenizer indexes it."""
    raw = token.encode("utf-8", "surrogatepass")
    if len(raw) < 3 or len(raw) > MAX_TOKEN_BYTES:
        return token
    w = _step1b(_step1a(raw.decode("latin-1")))
    if w.endswith("y") and _has_vowel(w[:-1]):
        w = w[:-1] + "i"
    w = _step(_step(_step(w, _STEP2), _STEP3), _STEP4)
    if w.endswith("e"):
        s = w[:-1]
        if _m_gt1(s) or (_m_eq1(s) and not _ostar(s)):
            w = s
    if len(w) > 1 and w.endswith("ll") and _m_gt1(w[:-1]):
        w = w[:-1]
    return w.encode("latin-1").decode("utf-8", "surrogatepass")
