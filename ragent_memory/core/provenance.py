"""Provenance — who said a piece of text. Every text the engine reads has one of four
sources: the user's own words, text the agent harness injected into a user turn (Claude Code's
``<system-reminder>`` blocks and CLAUDE.md, Codex's environment block and AGENTS.md, framework
reminders), a tool result, or the assistant.

Only the user's own words are learnt as facts about the user, quoted as the user's in a
summary, or indexed as what the user said. Harness text is recognised by ``Markers``: a marker
written as a tag (``<system-reminder>``) makes every ``<system-reminder>…</system-reminder>``
block of a text the harness's (an unclosed one runs to the end of the text); any other marker
is a prefix (``# AGENTS.md instructions for``) that makes a text starting with it the harness's
whole. A harness segment holding a standing marker (the CLAUDE.md contents, AGENTS.md, the
environment block) is a standing instruction: compaction carries its latest version instead of
summarizing it, keyed by the standing marker it holds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any, Final

import attrs

from ragent_memory.core.chars import InputRole, Message
from ragent_memory.settings import DEFAULT_HARNESS_MARKERS, DEFAULT_STANDING_MARKERS

__all__ = [
    "DEFAULT_HARNESS_MARKERS",
    "DEFAULT_STANDING_MARKERS",
    "TAGGED",
    "Markers",
    "Segment",
    "Source",
    "latest_standing",
    "source_tag",
]


# Turns that instruct rather than converse: inside the conversation they are standing
# instructions, carried whole across compactions, never summarized.
INSTRUCTION_ROLES: Final[frozenset[InputRole]] = frozenset({"system", "developer"})


class Source(StrEnum):
    USER = "user"
    HARNESS = "harness"
    TOOL = "tool"
    ASSISTANT = "assistant"


_TAG = re.compile(r"<([A-Za-z][\w.:-]*)>")
# The source tag a summary line starts with: "(user) ", "(assistant) ", "(tool: web_fetch) ",
# "(summary) " (a line whose source no one recorded).
TAGGED = re.compile(r"^\((?:user|assistant|harness|summary|tool: [^()\n]{1,80})\)\s")


def source_tag(source: Source | str, name: str = "") -> str:
    """The tag a summary line carries for its source: ``(user)``, ``(assistant)``,
    ``(tool: web_fetch)``, ``(harness)``."""
    source = Source(source)
    if source is Source.TOOL:
        return f"(tool: {name or 'tool'})"
    return f"({source.value})"


@attrs.frozen
class Segment:
    """A run of one text with one source; ``standing``: the standing marker a harness
    segment holds ("" for none)."""

    source: Source
    text: str
    standing: str = ""


class Markers:
    """Splits user turns into the user's own words and the harness's segments."""

    def __init__(
        self,
        harness: Sequence[str] = DEFAULT_HARNESS_MARKERS,
        standing: Sequence[str] = DEFAULT_STANDING_MARKERS,
    ) -> None:
        self.harness = tuple(harness)
        self.standing_markers = tuple(standing)
        self._tags = tuple(name for m in self.harness if (name := _tag_name(m)))
        self._prefixes = tuple(m for m in self.harness if not _tag_name(m))
        self._needles = (*(f"<{t}" for t in self._tags), *self._prefixes)
        names = "|".join(re.escape(t) for t in self._tags)
        self._opening = re.compile(rf"<({names})(?:\s[^<>]*)?>") if names else None

    @classmethod
    def from_settings(cls, settings: Any) -> Markers:
        """The markers ``settings`` names (``harness_markers``, ``standing_markers``)."""
        return cls(settings.harness_markers, settings.standing_markers)

    # ------------------------------------------------------------------ one text

    def split(self, text: str) -> list[Segment]:
        """``text`` of a user turn as segments in order: the harness's blocks and the user's
        words between them (whitespace-only runs left out)."""
        if not any(needle in text for needle in self._needles):
            return [Segment(Source.USER, text)] if text.strip() else []
        pieces: list[tuple[bool, str]] = []  # (is the harness's, text)
        at = 0
        while self._opening is not None:
            found = self._opening.search(text, at)
            if found is None:
                break
            close = f"</{found.group(1)}>"
            end = text.find(close, found.end())
            end = len(text) if end < 0 else end + len(close)
            pieces += [(False, text[at : found.start()]), (True, text[found.start() : end])]
            at = end
        pieces.append((False, text[at:]))
        out: list[Segment] = []
        for is_harness, piece in pieces:
            if not piece.strip():
                continue
            if is_harness or piece.lstrip().startswith(self._prefixes):
                out.append(self._harness(piece.strip()))
            else:
                out.append(Segment(Source.USER, piece.strip()))
        return out

    def _harness(self, text: str) -> Segment:
        key = next((m for m in self.standing_markers if m in text), "")
        return Segment(Source.HARNESS, text, key)

    def is_harness(self, text: str) -> bool:
        """Whether ``text`` holds harness text (and so is not wholly the user's)."""
        return any(s.source is Source.HARNESS for s in self.split(text))

    # ------------------------------------------------------------------ one message

    def segments(self, message: Mapping[str, Any], skip: Sequence[str] = ()) -> list[Segment]:
        """The message's text as segments: a user message split into the user's words and
        the harness's; a tool result and an assistant message one segment each. Text parts
        (or a string content) starting with one of ``skip`` (the engine's own blocks) are
        left out."""
        role = message.get("role")
        if role not in ("user", "tool", "assistant"):
            return []
        texts = [t for t in _texts(message) if not (skip and t.lstrip().startswith(tuple(skip)))]
        if role == "user":
            return [segment for text in texts for segment in self.split(text)]
        source = Source.TOOL if role == "tool" else Source.ASSISTANT
        return [Segment(source, text) for text in texts if text.strip()]

    def user_text(self, message: Mapping[str, Any], skip: Sequence[str] = ()) -> str:
        """The user's own words in ``message`` ("" for any other role): harness text and
        parts starting with one of ``skip`` left out, the rest joined by newlines."""
        if message.get("role") != "user":
            return ""
        return "\n".join(
            s.text for s in self.segments(message, skip) if s.source is Source.USER
        ).strip()

    def standing(self, message: Mapping[str, Any]) -> list[Segment]:
        """The standing instructions a message carries, in order: a user message's marked
        harness blocks; a system or developer turn inside the conversation (Claude Code's
        environment turn) is one whole, keyed by its role and first line."""
        role = message.get("role")
        if role in INSTRUCTION_ROLES:
            text = "\n".join(t for t in _texts(message) if t.strip()).strip()
            if not text:
                return []
            return [Segment(Source.HARNESS, text, f"{role}: {text.splitlines()[0][:80]}")]
        if role != "user":
            return []
        return [s for s in self.segments(message) if s.standing]

    def standing_keys(self, messages: Iterable[Mapping[str, Any]]) -> frozenset[str]:
        """The standing instructions (by key) ``messages`` carry."""
        return frozenset(s.standing for m in messages for s in self.standing(m))

    def user_words(self, message: Message) -> Message:
        """``message`` as the user said it: a user message's harness text taken out of its
        text parts (parts left empty dropped; other parts kept); any other message, or a user
        message holding no harness text, is returned as it is (the same dict)."""
        if message.get("role") != "user":
            return message
        content = message.get("content")
        if isinstance(content, str):
            kept = self._kept(content)
            return message if kept == content else {**message, "content": kept}
        if not isinstance(content, list):
            return message
        parts: list[Any] = []
        changed = False
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                text = part.get("text") or ""
                kept = self._kept(text)
                changed = changed or kept != text
                if kept:
                    parts.append(part if kept == text else {**part, "text": kept})
                continue
            parts.append(part)
        return {**message, "content": parts or ""} if changed else message

    def _kept(self, text: str) -> str:
        segments = self.split(text)
        if all(s.source is Source.USER for s in segments):
            return text
        return "\n\n".join(s.text for s in segments if s.source is Source.USER)


def _tag_name(marker: str) -> str:
    found = _TAG.fullmatch(marker.strip())
    return found.group(1) if found else ""


def _texts(message: Mapping[str, Any]) -> list[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [
        p.get("text") or ""
        for p in content
        if isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
    ]


def latest_standing(
    carried: Iterable[Mapping[str, Any]],
    material: Iterable[tuple[int, Mapping[str, Any]]],
    markers: Markers,
    *,
    shown: Iterable[str] = (),
) -> tuple[dict[str, Any], ...]:
    """The standing instructions a compaction carries: ``carried`` (``{"standing": key, "i":
    raw index, "text": …}`` entries) with those of ``material`` ((raw index, message) pairs)
    folded in — the latest version of each key, once, in order of first appearance — less the
    keys in ``shown`` (the kept tail holds a newer version of them)."""
    latest: dict[str, dict[str, Any]] = {e["standing"]: dict(e) for e in carried}
    for index, message in material:
        for segment in markers.standing(message):
            key = segment.standing
            latest[key] = {"standing": key, "i": index, "text": segment.text}
    hidden = set(shown)
    return tuple(e for key, e in latest.items() if key not in hidden)
