"""Strict role alternation, for chat templates that reject two user turns in a row
(``strict_alternation: true``, docs/design.md §12, §14b).

The engine's own messages after the leading system ones (memory block, summary) are ``user``
messages, as is the start of the raw tail, which a Mistral- or Gemma-style template refuses.
:func:`alternate` merges each inserted message into its neighbour of the same role, so two in
a row of one role remain only where the caller's own history had them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ragent_memory.core.chars import Message

SEPARATOR = "\n\n"


def _parts(content: Any) -> list[Any]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content)


def join_content(first: Any, second: Any) -> Any:
    """Both contents in order: one string when both are text, else one list of parts."""
    if first is None or first == "":
        return second
    if second is None or second == "":
        return first
    if isinstance(first, str) and isinstance(second, str):
        return first + SEPARATOR + second
    return _parts(first) + _parts(second)


def merge(first: Message, second: Message, *, keep_second_keys: bool) -> Message:
    """One message holding ``first``'s content then ``second``'s; the other fields (``name``…)
    come from the caller's message of the two."""
    base = dict(second if keep_second_keys else first)
    base["content"] = join_content(first.get("content"), second.get("content"))
    return base


def alternate(messages: Sequence[Message], inserted: range) -> list[Message]:
    """``messages`` with each message whose index is in ``inserted`` merged into an adjacent
    message of the same role. Never mutates its input; the caller's own adjacent same-role
    messages are left as they are."""
    out: list[Message] = []
    last_inserted = False
    for index, message in enumerate(messages):
        is_inserted = index in inserted
        if out and (is_inserted or last_inserted) and out[-1].get("role") == message.get("role"):
            out[-1] = merge(out[-1], message, keep_second_keys=not is_inserted)
        else:
            out.append(message)
        last_inserted = is_inserted
    return out
