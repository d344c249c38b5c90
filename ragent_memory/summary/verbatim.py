"""The user's own words (docs/design.md §6): the verbatim list under ``## User requests``, built by
the engine from real user messages, carried as state across generations and composed into
the model's body — only the engine's block may quote the user there."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ragent_memory.core.chars import text_of
from ragent_memory.errors import SummaryError
from ragent_memory.summary.fence import INVISIBLE
from ragent_memory.summary.prompt import EMPTY, SECTIONS
from ragent_memory.summary.transcript import clip_middle
from ragent_memory.summary.validate import validate_summary

VERBATIM_LABEL = MappingProxyType({"en": "In the user's own words:", "zh": "用户原话："})
_CONSTRAINT_EN = re.compile(
    r"\b(?:not|never|no|none|nothing|don'?t|doesn'?t|won'?t|can'?t|cannot|mustn'?t|shouldn'?t"
    r"|without|except|only|must|at most|at least|no more than|less than|more than|fewer than"
    r"|under|below|above|over|exceed\w*|limit\w*|max(?:imum)?|min(?:imum)?|budget|deadline"
    r"|due|before|until|till|within|hold|wait|yet|keep|always)\b",
    re.IGNORECASE,
)
_CONSTRAINT_ZH = re.compile(
    r"不|别|没|勿|禁止|只|仅|必须|务必|最多|至少|以内|之前|截止|期限|预算|暂|等我|保留|始终|永远"
)
# A quantity: a number with a currency or a unit (a bare number, like "turn 5", is not one).
_QUANTITY = re.compile(
    r"[$€£¥]\s*\d|\d[\d,.]*\s*(?:%|[$€£¥]|(?:euros?|eur|dollars?|usd|gbp|rmb|yuan|k|m|kg|g|km|m"
    r"|miles?|hours?|hrs?|h|minutes?|mins?|days?|weeks?|months?|years?|items?|words?|chars?"
    r"|characters?|pages?|people|persons?|users?|rooms?|nights?|tokens?|requests?)\b)"
    r"|\d\s*(?:元|块|万|千|百|天|周|月|年|小时|分钟|个|件|次|人|字|页|间|晚)",
    re.IGNORECASE,
)


def states_constraint(text: str) -> bool:
    """Does a user message state a constraint (negation, limit, deadline, quantity, hold)?"""
    return any(p.search(text) for p in (_CONSTRAINT_EN, _CONSTRAINT_ZH, _QUANTITY))


MAX_PINNED_KEPT = 64
MAX_OTHERS_KEPT = 32


def update_verbatim(
    entries: Sequence[Mapping[str, Any]], material: Sequence[tuple[int, Mapping[str, Any]]]
) -> tuple[dict[str, Any], ...]:
    """Add the user messages of ``material`` ((raw index, message) pairs) to the list: the
    first and those stating a constraint pinned, the newest of each kind kept (bounded)."""
    out = [dict(e) for e in entries]
    seen = {e["i"] for e in out}
    is_first = not out
    for index, message in material:
        if message.get("role") != "user" or index in seen:
            continue
        text = text_of(message).strip()
        if not text:
            continue
        is_pinned = is_first or states_constraint(text)
        out.append({"i": index, "text": text, "pinned": is_pinned, "first": is_first})
        is_first = False
    pinned = [e for e in out if e["pinned"]]
    firsts = [e for e in pinned if e.get("first")]
    keep_pinned = pinned[-MAX_PINNED_KEPT:]
    if firsts and firsts[0] not in keep_pinned:
        keep_pinned = [firsts[0], *keep_pinned[1:]]
    keep = {id(e) for e in keep_pinned} | {
        id(e) for e in [e for e in out if not e["pinned"]][-MAX_OTHERS_KEPT:]
    }
    return tuple(e for e in out if id(e) in keep)


def _quote(text: str) -> str:
    return "\n".join("> " + line if line else ">" for line in text.splitlines() or [""])


def render_verbatim(entries: Sequence[Mapping[str, Any]], *, budget: int, language: str) -> str:
    """The quoted user messages within ``budget`` chars, in conversation order: the first
    message, then the other pinned ones newest first, then the newest others."""
    if not entries:
        return ""
    label = VERBATIM_LABEL[language]
    remaining = budget - len(label) - 1
    first = [e for e in entries if e.get("first")]
    pinned = [e for e in entries if e["pinned"] and not e.get("first")]
    others = [e for e in entries if not e["pinned"]]
    chosen: dict[int, str] = {}
    for entry in [*first, *reversed(pinned), *reversed(others)]:
        quoted = _quote(entry["text"])
        room = remaining - 40
        if len(quoted) + 1 > remaining and (remaining >= 120 or not chosen) and room >= 40:
            head = room * 2 // 3
            quoted = _quote(clip_middle(entry["text"], over=room, head=head, tail=room - head))
        if len(quoted) + 1 <= remaining:
            chosen[entry["i"]] = quoted
            remaining -= len(quoted) + 1
    if not chosen:
        return ""
    return label + "\n" + "\n".join(chosen[i] for i in sorted(chosen))


# Quote marks after any indent (ideographic spaces and invisible characters included) and an
# optional list marker (``-``, ``*``, ``+``, ``1.``, ``1)``): ``>`` and its full-width forms.
_QUOTE_MARKS = re.compile(
    rf"^([\s{INVISIBLE}]*(?:(?:[-*+•]|\d{{1,9}}[.)])[\s{INVISIBLE}]+)?)(?:[>＞﹥][\s{INVISIBLE}]*)+"
)
_HIDE_INVISIBLE = str.maketrans("", "", INVISIBLE)


def _is_title(line: str, title: str) -> bool:
    """``line`` is ``title`` give or take case, spacing, invisible characters and a colon."""
    line = line.translate(_HIDE_INVISIBLE)
    return " ".join(line.rstrip(" \t:：").split()).casefold() == title.casefold()


def _unquote_requests(body: str, language: str) -> str:
    """The body with quote marks (and the verbatim label) taken off the model's own lines
    under ``## User requests``: only the engine's block may quote the user there."""
    title = SECTIONS[language][0]
    out: list[str] = []
    requests: list[str] = []  # every User requests section's lines, merged into the first
    at: int | None = None  # where the first one's lines go
    in_requests = False
    for line in body.splitlines():
        line = line.lstrip(INVISIBLE)  # an invisible prefix must not hide a title
        if line.startswith("## "):
            in_requests = _is_title(line, title)
            if not in_requests:
                out.append(line)
            elif at is None:
                out.append(title)
                at = len(out)
        elif not in_requests:
            out.append(line)
        elif line.translate(_HIDE_INVISIBLE).strip() != VERBATIM_LABEL[language]:
            unquoted = _QUOTE_MARKS.sub(r"\1", line)
            if unquoted.strip() or not line.strip():
                requests.append(unquoted)
    if at is not None:
        out[at:at] = requests
    return "\n".join(out)


def compose_summary(body: str, verbatim_quotes: str, language: str) -> str:
    """Insert the verbatim quotes at the end of ``## User requests``; quote lines the model
    wrote there (a request forged by a tool result, say) lose their ``>``."""
    body = _unquote_requests(body, language)
    if not verbatim_quotes:
        return body
    title = SECTIONS[language][0]
    lines = body.splitlines()
    if title not in lines:
        return f"{title}\n{verbatim_quotes}\n\n{body}"
    start = lines.index(title)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    section = [line for line in lines[start + 1 : end] if line.strip()]
    if section == [EMPTY[language]]:
        section = []
    merged = [*lines[: start + 1], *section, verbatim_quotes, "", *lines[end:]]
    return "\n".join(merged).strip()


def fit_summary(body: str, verbatim_quotes: str, language: str, max_chars: int) -> tuple[str, str]:
    """The body (fitted inside its sections if need be) and the composed summary within
    ``max_chars``, even when a ``## User requests`` the model left out is added."""
    summary = compose_summary(body, verbatim_quotes, language)
    overflow = len(summary) - max_chars
    if overflow > 0:
        body = validate_summary(body, max_chars=len(body) - overflow)
        summary = compose_summary(body, verbatim_quotes, language)
    if len(summary) > max_chars:
        raise SummaryError(f"summary of {len(summary)} chars exceeds the {max_chars} target")
    return body, summary
