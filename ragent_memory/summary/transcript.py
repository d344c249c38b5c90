"""The transcript the summarizer reads (docs/design.md §6): ``[user] …`` lines, one per message or
tool call, long texts clipped (``Clip``) so the material fits what a pass may send."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ragent_memory.core.chars import Message, text_of
from ragent_memory.settings import TRANSCRIPT_CLIP_OVER_CHARS
from ragent_memory.summary.fence import neutralise_tags


def clip_middle(text: str, *, over: int, head: int, tail: int) -> str:
    """Head + ``…(N chars omitted)…`` + tail for text longer than ``over``."""
    if len(text) <= over:
        return text
    omitted = len(text) - head - tail
    return f"{text[:head]}…({omitted} chars omitted)…{text[len(text) - tail :]}"


def _entry(text: str) -> str:
    # Continuation lines are indented, so only the renderer can start a line with "[user]",
    # "## " or "> ": a tool result cannot forge a user turn, a section or a quote.
    return "\n  ".join(text.splitlines())


@attrs.frozen
class Clip:
    """The cap on each kind of text (default docs/design.md §1's; ``None``: whole), longer becomes head
    (2/3) + marker + tail (1/3); ``omitted``: the oldest messages left out, shown as one line."""

    tool: int | None = TRANSCRIPT_CLIP_OVER_CHARS
    assistant: int | None = TRANSCRIPT_CLIP_OVER_CHARS
    user: int | None = TRANSCRIPT_CLIP_OVER_CHARS
    omitted: int = 0

    def cap(self, kind: str) -> int | None:
        return self.tool if kind == "tool" else self.user if kind == "user" else self.assistant


DEFAULT_CLIP = Clip()
UNCLIPPED = Clip(None, None, None)
# Clipped in this order when the material is too large: tool texts first, the user's last
# (their own words are also quoted verbatim in the summary by the engine, docs/design.md §6).
CLIP_ORDER = ("tool", "assistant", "user")


def clip_text(text: str, cap: int | None) -> str:
    """``text`` within ``cap`` as the transcript shows it (see ``Clip``)."""
    if cap is None or len(text) <= cap:
        return text
    head = cap * 2 // 3
    clipped = clip_middle(text, over=cap, head=head, tail=cap - head)
    # Below the §1 default a marker longer than what it hides would only add chars.
    return clipped if cap >= TRANSCRIPT_CLIP_OVER_CHARS or len(clipped) < len(text) else text


# A message as the transcript shows it: (kind, label, text) per entry line.
_Parts = tuple[tuple[str, str, str], ...]


def _parts(material: Sequence[Mapping[str, Any]]) -> list[_Parts]:
    """Each message's entries, fence-like tags already neutralised (docs/design.md §6), so the
    length measured here is the length sent."""
    names: dict[str, str] = {}
    out: list[_Parts] = []
    for message in material:
        role = message.get("role")
        text = neutralise_tags(text_of(message))
        parts: list[tuple[str, str, str]] = []
        if role == "assistant":
            if text.strip():
                parts.append(("assistant", "[assistant] ", text))
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                name = neutralise_tags(function.get("name") or "")
                names[call.get("id", "")] = name
                arguments = neutralise_tags(function.get("arguments") or "")
                parts.append(("tool", f"[assistant → tool] {name} ", arguments))
        elif role == "tool":
            called = names.get(message.get("tool_call_id", ""))
            if called is None:
                called = neutralise_tags(message.get("name") or "tool")
            parts.append(("tool", f"[tool result · {called}] ", text))
        elif text.strip():  # a user turn that held only the harness's text shows nothing
            kind = "user" if role == "user" else "assistant"
            parts.append((kind, f"[{role}] ", text))
        out.append(tuple(parts))
    return out


def _omitted_line(count: int) -> str:
    return f"[{count} earlier messages omitted]"


class Transcript:
    """Material as the summarizer reads it (docs/design.md §6), rendered at any ``Clip``: ``[user] …``,
    ``[assistant → tool] name args``, ``[tool result · name] …``."""

    def __init__(self, material: Sequence[Mapping[str, Any]]) -> None:
        self.material = tuple(material)
        self._parts = _parts(self.material)

    def _entries(self, clip: Clip) -> list[str]:
        """One entry per message ("" for the omitted ones and those with nothing to show)."""
        return [
            ""
            if index < clip.omitted
            else "\n".join(
                _entry(label + clip_text(text, clip.cap(kind))) for kind, label, text in parts
            )
            for index, parts in enumerate(self._parts)
        ]

    def render(self, clip: Clip = DEFAULT_CLIP) -> str:
        lines = [_omitted_line(clip.omitted)] if clip.omitted else []
        return "\n".join(lines + [entry for entry in self._entries(clip) if entry])

    def fit(self, max_chars: int, *, start: Clip = DEFAULT_CLIP) -> Clip:
        """The gentlest clip from ``start`` that fits ``max_chars``: kinds in ``CLIP_ORDER``, each
        to the largest cap that fits, then the fewest oldest messages left out."""

        def fits(clip: Clip) -> bool:
            return len(self.render(clip)) <= max_chars

        clip = start
        if fits(clip):
            return clip
        for kind in CLIP_ORDER:
            floor = attrs.evolve(clip, **{kind: 0})
            if not fits(floor):
                clip = floor
                continue
            low, high = 0, clip.cap(kind)
            if high is None:
                high = max((len(t) for p in self._parts for k, _, t in p if k == kind), default=0)
            while low < high:  # the largest cap that fits; fits(low) holds throughout
                middle = (low + high + 1) // 2
                if fits(attrs.evolve(clip, **{kind: middle})):
                    low = middle
                else:
                    high = middle - 1
            return attrs.evolve(clip, **{kind: low})
        low, high = 1, len(self._parts)
        while low < high:  # the fewest omitted messages that fit (all of them, if need be)
            middle = (low + high) // 2
            if fits(attrs.evolve(clip, omitted=middle)):
                high = middle
            else:
                low = middle + 1
        return attrs.evolve(clip, omitted=low)

    def chunks(self, clip: Clip, max_chars: int) -> list[str]:
        """The rendering in chunks of at most ``max_chars``, split at user turns (docs/design.md §6),
        a longer turn between its messages (a longer message is a chunk of its own)."""
        turns: list[list[str]] = [[_omitted_line(clip.omitted)]] if clip.omitted else []
        for message, entry in zip(self.material, self._entries(clip), strict=True):
            if message.get("role") == "user" or not turns:
                turns.append([])
            if entry:
                turns[-1].append(entry)
        pieces: list[str] = []
        for turn in filter(None, turns):
            whole = "\n".join(turn)
            pieces.extend([whole] if len(whole) <= max_chars else turn)
        chunks: list[str] = []
        for piece in pieces:
            if chunks and len(chunks[-1]) + 1 + len(piece) <= max_chars:
                chunks[-1] += "\n" + piece
            else:
                chunks.append(piece)
        return chunks

    def clipped(self, clip: Clip) -> tuple[Message, ...]:
        """The material as a reader of ``render(clip)`` sees it: texts clipped (tags
        neutralised), the omitted messages left out, other fields as they were."""
        out: list[Message] = []
        for message, parts in list(zip(self.material, self._parts, strict=True))[clip.omitted :]:
            copy = dict(message)
            texts = iter([clip_text(text, clip.cap(kind)) for kind, _, text in parts])
            is_assistant = message.get("role") == "assistant"
            if message.get("role") == "tool" or text_of(message).strip():
                copy["content"] = next(texts)
            if is_assistant and message.get("tool_calls"):
                copy["tool_calls"] = [
                    {**call, "function": {**(call.get("function") or {}), "arguments": next(texts)}}
                    for call in message["tool_calls"]
                ]
            out.append(copy)
        return tuple(out)
