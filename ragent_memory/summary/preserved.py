"""Preserved tool outputs (docs/design.md §6, Eino's PreserveSkills): results of ``preserved_tools``
are instructions, never summarized; the latest of each is carried verbatim as session state and
shown after the summary, within ``preserved_max_chars``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ragent_memory.core.chars import text_of
from ragent_memory.summary.transcript import clip_middle

TITLE = MappingProxyType({"en": "## Preserved tool outputs", "zh": "## 保留的工具输出"})
MIN_SHOWN = 80  # below this a result is left out rather than shown as a stub


def update_preserved(
    entries: Sequence[Mapping[str, Any]],
    material: Sequence[tuple[int, Mapping[str, Any]]],
    tools: Sequence[str],
) -> tuple[dict[str, Any], ...]:
    """The carried results with those of ``material`` ((raw index, message) pairs) folded in:
    one entry per preserved tool, its latest result, most recently loaded last."""
    names: dict[str, str] = {}  # tool_call_id -> tool name
    latest = {e["tool"]: dict(e) for e in entries}
    for index, message in material:
        for call in message.get("tool_calls") or ():
            names[call.get("id", "")] = (call.get("function") or {}).get("name", "")
        if message.get("role") != "tool":
            continue
        name = names.get(message.get("tool_call_id", "")) or message.get("name") or ""
        if name in tools:
            latest.pop(name, None)
            latest[name] = {"tool": name, "i": index, "text": text_of(message)}
    return tuple(latest.values())


def render_preserved(entries: Sequence[Mapping[str, Any]], *, budget: int, language: str) -> str:
    """The preserved results under their own title within ``budget`` chars: the most recently
    loaded first gets its share, a longer result is clipped in the middle."""
    if not entries:
        return ""
    title = TITLE[language]
    remaining = budget - len(title)
    shown: list[tuple[int, str]] = []
    for k, entry in enumerate(reversed(entries)):
        header = f"\n### {entry['tool']}\n"
        share = (remaining // (len(entries) - k)) - len(header)
        if share < MIN_SHOWN:
            continue
        text = str(entry["text"])
        if len(text) > share:
            head = (share - 40) * 2 // 3
            text = clip_middle(text, over=share, head=head, tail=share - 40 - head)
        remaining -= len(header) + len(text)
        shown.append((entry["i"], header + text))
    if not shown:
        return ""
    return title + "".join(block for _, block in sorted(shown))
