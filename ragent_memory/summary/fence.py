"""The nonce fence (docs/design.md §6): what the model reads as material is fenced with a random nonce,
and every fence-like tag (any case, full-width or with invisible characters) and the nonce
itself are neutralised in the text first, so the material cannot close or forge a fence."""

from __future__ import annotations

import re
import secrets

NEUTRALISED = "[fence marker neutralised]"
FENCE_TAGS = ("transcript", "previous_summary", "conversation_summary", "user_memory")
# Characters a model or a tool result can slip into a tag or before a quote mark; they render
# as nothing, so ``<tran\u200bscript>`` reads as a fence tag to a model.
INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff\u00ad"
_GAP = f"[{INVISIBLE}]*"


def _lookalike(name: str) -> str:
    """A pattern for ``name`` in any case, in ASCII or full-width letters, with invisible
    characters anywhere between them."""

    def char(c: str) -> str:
        if c == "_":
            return "[_＿]"
        return f"[{c}{c.upper()}{chr(ord(c) + 0xFEE0)}{chr(ord(c.upper()) + 0xFEE0)}]"

    return _GAP.join(char(c) for c in name)


_OPEN = r"(?:<|＜|﹤|&lt;|&#0*60;|&#x0*3c;)"
_CLOSE = r"(?:>|＞|﹥|&gt;|&#0*62;|&#x0*3e;)"
# A fence-like tag, any case and spacing. When its ``>`` is not on the same line within 200
# chars only the opener is replaced: that alone stops it acting as a tag, and no stretch of
# material is swallowed.
_TAG_RE = re.compile(
    _OPEN
    + rf"[\s{INVISIBLE}]*(?:/|／)?[\s{INVISIBLE}]*(?:"
    + "|".join(_lookalike(tag) for tag in FENCE_TAGS)
    + rf")(?!\w)(?:[^<>＜＞\n]{{0,200}}{_CLOSE})?",
    re.IGNORECASE,
)


def neutralise_tags(text: str) -> str:
    """``text`` with every fence-like tag replaced by ``NEUTRALISED``."""
    return _TAG_RE.sub(NEUTRALISED, text)


def neutralise(text: str, nonce: str) -> str:
    """Replace every fence/summary/memory tag (any case) and every occurrence of the nonce."""
    text = neutralise_tags(text)
    return re.sub(re.escape(nonce), NEUTRALISED, text, flags=re.IGNORECASE)


def new_nonce() -> str:
    return secrets.token_hex(8)
