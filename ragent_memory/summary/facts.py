"""What a summary of a technical chat keeps (the offline summarizer's reading of long replies):
the prose of a message without its code blocks and markdown markup, the weight of a sentence
that states a version, a decision or a change, and a newer statement of a value superseding
the older one (kept as ``new (before: old)``). Pure functions, no state."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ragent_memory.core.identifiers import identifiers, kept_in

# A fenced code block (an unclosed one runs to the end of the text).
_FENCE = re.compile(r"^[ \t]*(```|~~~).*?(?:^[ \t]*\1[^\n]*$|\Z)", re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r"^[ \t]*#{1,6}[ \t]+.*$|^[ \t]*[-=*_]{3,}[ \t]*$", re.MULTILINE)
_LIST = re.compile(r"^[ \t]*(?:[-*+•][ \t]+|\d{1,2}[.)][ \t]+)", re.MULTILINE)
_EMPHASIS = re.compile(r"\*\*|__|(?<!\w)`|`(?!\w)")
# A line that reads as code or configuration rather than prose: few letters and spaces.
_PROSE_SHARE = 0.72
_TABLE_RULE = re.compile(r"^\s*\|?[\s:|-]+\|[\s:|-]*$")


def _is_code(line: str) -> bool:
    stripped = line.strip()
    if len(stripped) < 12 or _TABLE_RULE.match(stripped):
        return bool(_TABLE_RULE.match(stripped))
    plain = sum(1 for c in stripped if c.isalpha() or c.isspace() or c in ",.!?'’\"-()")
    return plain / len(stripped) < _PROSE_SHARE or stripped.endswith((";", "{", "}", "=>"))


def prose(text: str) -> str:
    """``text`` without fenced code blocks, headings, rules, code-like lines and markdown
    emphasis; each list item on its own line (list markers dropped)."""
    if "```" not in text and "~~~" not in text and "#" not in text and "*" not in text:
        return text
    text = _HEADING.sub("", _FENCE.sub("", text))
    text = _EMPHASIS.sub("", _LIST.sub("", text))
    return "\n".join(line for line in text.splitlines() if line.strip() and not _is_code(line))


_VERSION = re.compile(r"(?<![\w.])v?\d+\.\d+(?:\.\d+)*(?!\w|\.\d)")
_DECISION = re.compile(
    r"\b(?:decided|decide to|chose|choosing|going with|go with|went with|settled on|opted|"
    r"switched|switching|switch to|migrat(?:e|ed|ing) to|upgrad(?:e|ed|ing)|downgrad(?:e|ed|ing)|"
    r"replac(?:e|ed|ing)|instead of|changed|changing|moved to|updated to|increased|reduced|"
    r"raised|lowered|bumped|deadline|due by|aiming for|target(?:ing)? (?:of|is)|now (?:use|using|"
    r"at|is|has|runs?))\b|决定|改为|换成|升级|迁移到|截止",
    re.IGNORECASE,
)
_CHANGE = re.compile(r"\bfrom\s+(\S[^,;]{0,60}?)\s+to\s+(\S[^,;.]{0,60})", re.IGNORECASE)


def technical_weight(sentence: str) -> float:
    """Extra weight for a sentence that states a version, a decision or a change (what a later
    question about a technical project asks for)."""
    weight = 1.5 * min(len(_VERSION.findall(sentence)), 2)
    if _DECISION.search(sentence):
        weight += 2.0
    if _CHANGE.search(sentence):
        weight += 1.0
    return weight


_TOPIC = re.compile(r"[^\W\d_]{3,}", re.UNICODE)
_ITEM_META = re.compile(r"^\s*(?:\([^()\n]{1,80}\)\s*)?(?:\[[^\]]{0,80}\]\s*)?")
_BEFORE = re.compile(r"\s*\(before: [^()]*\)$")
# Two statements share a topic when this share of their words (3+ letters) is the same.
SAME_TOPIC = 0.7
MIN_TOPIC_WORDS = 3


def _topic(item: str) -> frozenset[str]:
    text = _BEFORE.sub("", _ITEM_META.sub("", item, count=1))
    return frozenset(w.lower() for w in _TOPIC.findall(text))


_VALUE = re.compile(r"(?<![\w.-])(?:[$€£¥]|v)?\d[\d,]*(?:\.\d+)*(?:\s?[a-zA-Z%]{1,5}\b)?")
_AMOUNT_START = "$€£¥0123456789"


def _values(text: str) -> list[str]:
    """The values a statement gives (numbers, versions, amounts)."""
    return list(dict.fromkeys(v.strip() for v in _VALUE.findall(text)))


def _subjects(text: str) -> list[str]:
    """What a statement is about that no newer value replaces: its names, codes, addresses
    and dates (a different invoice or person is another thing, not a change)."""
    return [i for i in identifiers(text) if i[0] not in _AMOUNT_START]


def _same_thing(older: str, newer: str) -> bool:
    words, topic = _topic(older), _topic(newer)
    shared = len(words & topic)
    if shared < MIN_TOPIC_WORDS or shared < SAME_TOPIC * min(len(words), len(topic)):
        return False
    return all(kept_in(subject, newer) for subject in _subjects(older))


def supersede(newer: Sequence[str], older: Sequence[str]) -> tuple[list[str], list[str]]:
    """``newer`` and ``older`` items where an older statement of the same topic with other
    values (numbers, versions, amounts) is dropped and its values noted on the newer one as
    ``(before: …)``: the latest value shown as the latest, what it changed from beside it."""
    newer, kept = list(newer), []
    texts = [_BEFORE.sub("", _ITEM_META.sub("", item, count=1)) for item in newer]
    for item in older:
        text = _BEFORE.sub("", _ITEM_META.sub("", item, count=1))
        values = _values(text)
        at = next(
            (
                k
                for k, now in enumerate(texts)
                if values and _values(now) and _same_thing(text, now)
            ),
            None,
        )
        changed = [] if at is None else [v for v in values if not kept_in(v, texts[at])]
        if at is None or not changed:
            kept.append(item)
            continue
        if not _BEFORE.search(newer[at]):
            newer[at] = f"{newer[at]} (before: {', '.join(changed[:4])})"
    return newer, kept
