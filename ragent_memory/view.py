"""Per-session caches that keep ``prepare`` incremental.

The usual app appends to one history and passes the same dicts again every turn. ``RawCache``
remembers the last history by identity (plus the identity of each message's content and tool
calls, so an in-place edit of a field is noticed) and reuses what it computed for unchanged
messages: validation, digest and size. Only new or changed messages are hashed and measured.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .chars import Message, chars, validate_message


def digest(message: Mapping[str, Any]) -> str:
    """A content digest of one message (stable across processes)."""
    encoded = json.dumps(message, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(encoded.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def chain_digest(digests: Sequence[str]) -> str:
    """One digest over a run of message digests (the covered prefix check)."""
    return hashlib.sha256("\n".join(digests).encode()).hexdigest()[:32] if digests else ""


def _fingerprint(message: Mapping[str, Any]) -> tuple[Any, ...]:
    return (
        message.get("content"),
        message.get("tool_calls"),
        message.get("role"),
        message.get("tool_call_id"),
    )


def _same(message: Mapping[str, Any], fingerprint: tuple[Any, ...]) -> bool:
    return (
        message.get("content") is fingerprint[0]
        and message.get("tool_calls") is fingerprint[1]
        and message.get("role") == fingerprint[2]
        and message.get("tool_call_id") == fingerprint[3]
    )


class RawCache:
    """What the engine knows about the caller's last history, by position."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.fingerprints: list[tuple[Any, ...]] = []
        self.digests: list[str] = []
        self.sizes: list[int] = []
        self.unchanged = 0  # leading messages unchanged by the last sync

    def sync(self, messages: Sequence[Any]) -> int:
        """Adopt ``messages`` as the new history; returns how many leading messages were
        unchanged (same dict, same fields) since the last call.

        Validates only the new or changed messages; on an invalid message the cache is left
        as it was and InvalidMessagesError propagates.
        """
        old = self.messages
        limit = min(len(messages), len(old))
        same = 0
        while (
            same < limit
            and messages[same] is old[same]
            and _same(messages[same], self.fingerprints[same])
        ):
            same += 1
        fresh = messages[same:]
        for offset, message in enumerate(fresh):
            validate_message(message, same + offset)
        self.messages = list(messages)
        self.fingerprints = self.fingerprints[:same] + [_fingerprint(m) for m in fresh]
        self.digests = self.digests[:same] + [digest(m) for m in fresh]
        self.sizes = self.sizes[:same] + [chars(m) for m in fresh]
        self.unchanged = same
        return same
