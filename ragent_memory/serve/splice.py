"""What the model saw in place of a reply the app got (``Splices``).

When the model calls the proxy's own tools, the app gets one reply it can continue from: the
proxy's calls cut out, their answers never shown. The model saw more: its reply with the
proxy's calls, the proxy's answers, and (after a round the proxy answered) its next reply. So
that the model keeps seeing what it saw, the proxy remembers that sequence and, when the app
sends the reply back in its next request's history, puts the sequence in its place: the same
message objects on every later request of the session, so what goes upstream is byte-stable
(the prompt cache holds) and the engine records the conversation the model had.

A reply is known by where it sits in the app's history (the app appends to it) and by what it
says (its text, whitespace aside, and its tool call ids): an app that edits or rewrites its
history simply gets no splice there. Bounded: the latest ``PER_SESSION`` splices of each of
the latest ``SESSIONS`` sessions, at most ``MAX_CHARS`` characters of messages in all (least
recently used sessions out first); a splice that is dropped leaves the model the app's reply as
it is.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from ragent_memory.core.chars import Message, text_of, total_chars
from ragent_memory.core.lru import LRU

PER_SESSION = 256
SESSIONS = 4096
MAX_CHARS = 64_000_000
Key = tuple[str, tuple[Any, ...]]
Entry = tuple[Key, list[Message], int]  # fingerprint, what the model saw, its chars


def _entry_chars(_position: int, entry: Entry) -> int:
    return entry[2]


def _held(_session: Hashable, splices: LRU[int, Entry]) -> int:
    return splices.weight


def fingerprint(message: Mapping[str, Any]) -> Key:
    """What an assistant reply says, as the app may send it back: its text without
    whitespace, and its tool call ids."""
    calls = tuple(
        call.get("id") for call in message.get("tool_calls") or () if isinstance(call, dict)
    )
    return "".join(text_of(message).split()), calls


class Splices:
    """Per session: the position of a reply in the app's history → (its fingerprint, what
    the model saw in its place). Thread-safe. Sessions and each session's splices are
    ``LRU``s bounded by count; the chars bound spans every session and lets single splices
    go (the oldest of the least recently used session), which no one ``LRU``'s bound says,
    so it is kept here."""

    def __init__(
        self, per_session: int = PER_SESSION, sessions: int = SESSIONS, max_chars: int = MAX_CHARS
    ) -> None:
        self.per_session, self.sessions, self.max_chars = per_session, sessions, max_chars
        # session → its splices (position → entry, the oldest first), weighed by their chars
        self._by_session: LRU[Hashable, LRU[int, Entry]] = LRU(sessions, None, _held)
        self._lock = threading.Lock()

    @property
    def chars(self) -> int:
        """What all kept splices hold."""
        return self._by_session.weight

    def record(
        self, session: Hashable, position: int, reply: Mapping[str, Any], seen: Sequence[Message]
    ) -> None:
        """The app got ``reply`` at ``position`` of its history; the model saw ``seen``."""
        size = total_chars(seen)
        with self._lock:
            known = self._by_session.get(session)
            if known is None:
                known = LRU(self.per_session, None, _entry_chars)
                self._by_session.put(session, known)
            before = known.weight
            known.put(position, (fingerprint(reply), list(seen), size))
            self._by_session.resized(session, known.weight - before)
            while self._by_session and self.chars > self.max_chars:
                self._drop_oldest()

    def _drop_oldest(self) -> None:
        """The oldest splice of the least recently used session out (its session with it
        when it was the last)."""
        session, known = next(iter(self._by_session.items()))
        before = known.weight
        known.pop(next(iter(known)))
        self._by_session.resized(session, known.weight - before)
        if not known:
            self._by_session.pop(session)

    def apply(self, session: Hashable, history: list[Message]) -> list[Message]:
        """``history`` with every reply the session knows replaced by what the model saw in
        its place (``history`` itself when there is none)."""
        with self._lock:
            known = self._by_session.get(session)
            if not known:
                return history
            found = sorted(known.items(), reverse=True)
        out = history
        for position, (key, seen, _) in found:
            if position >= len(history):
                continue
            message = history[position]
            if message.get("role") != "assistant" or fingerprint(message) != key:
                continue
            if out is history:
                out = list(history)
            out[position : position + 1] = seen
        return out
