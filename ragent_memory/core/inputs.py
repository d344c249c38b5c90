"""Input normalisation: what SDKs hand out, accepted as chat dicts (DESIGN §14b).

An app built on an SDK holds its history as the SDK's pydantic objects (the OpenAI client's
``ChatCompletionMessage``, anything with ``model_dump``) and may use the ``developer`` role,
OpenAI's newer name for ``system``. Both become plain chat dicts before the engine looks at
them; plain dicts with the usual roles pass through as they are.

A converted message is remembered by the identity of the caller's object, so the app that
passes the same objects again gets the same dicts again: the engine's per-turn identity check
(§5) keeps hitting and ``prepare`` stays incremental.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from typing import Any

from ragent_memory.core.chars import Message
from ragent_memory.errors import InvalidMessagesError

ALIASES = {"developer": "system"}
# Chat dicts as they come: the app's own, or copies ``prepare`` handed out that it kept.
PLAIN_TYPES = frozenset({dict})
# Conversions kept per engine; an app passing more objects than this each turn pays a
# conversion per message (and the engine a digest instead of an identity check), nothing worse.
MAX_REMEMBERED = 100_000


def to_message(item: Any) -> Any:
    """One message as a chat dict: ``model_dump(exclude_none=True)`` for pydantic objects, the
    ``developer`` role as ``system``. Anything else is returned unchanged (validation names it)."""
    if not isinstance(item, Mapping) and callable(getattr(item, "model_dump", None)):
        item = item.model_dump(exclude_none=True)
    if isinstance(item, Mapping) and _is_alias(item.get("role")):
        item = {**item, "role": ALIASES[item["role"]]}
    return item


def _is_alias(role: Any) -> bool:
    # Only a string can be an alias; an unhashable role is left for validation to name.
    return isinstance(role, str) and role in ALIASES


def needs_conversion(item: Any) -> bool:
    return type(item) not in PLAIN_TYPES or _is_alias(item.get("role"))


def all_plain(messages: Sequence[Any]) -> bool:
    """No message needs converting, found in C-level passes over the list (a few tens of ns a
    message, against a Python call each): a first call, or a history rebuilt, is read whole."""
    if not PLAIN_TYPES.issuperset(map(type, messages)):
        return False
    roles = list(map(dict.get, messages, repeat("role")))
    try:
        return not any(map(roles.__contains__, ALIASES))
    except Exception:  # a role whose == raises: the per-message path leaves it to validation
        return False


class Inputs:
    """The engine's input boundary: a list of messages in, chat dicts out, the caller's objects
    never touched."""

    def __init__(
        self,
        convert: Callable[[Any], Any] = to_message,
        max_remembered: int = MAX_REMEMBERED,
    ) -> None:
        self._convert_one = convert  # a framework adapter passes its own message converter
        self._max = max_remembered
        self._lock = threading.Lock()
        # id(original) → (original, converted); holding the original keeps its id unique.
        self._seen: OrderedDict[int, tuple[Any, Any]] = OrderedDict()

    def accept(self, messages: Any, *, plain: int = 0) -> Sequence[Message]:
        """``messages`` as chat dicts (the caller's own list when nothing needs converting).
        ``plain``: how many leading messages the caller already passed as plain chat dicts
        (the session's cursor checks those by identity), so only the rest is looked at."""
        if not isinstance(messages, list | tuple):
            raise InvalidMessagesError(
                None, f"expected a list of messages, got {type(messages).__name__}"
            )
        if all_plain(messages[plain:] if plain else messages):
            return messages
        return [self._convert(m) if needs_conversion(m) else m for m in messages]

    def _convert(self, item: Any) -> Any:
        key = id(item)
        with self._lock:
            hit = self._seen.get(key)
            if hit is not None and hit[0] is item:
                self._seen.move_to_end(key)
                return hit[1]
        converted = self._convert_one(item)
        if converted is item:  # not a message at all: left for validation to name
            return item
        with self._lock:
            self._seen[key] = (item, converted)
            while len(self._seen) > self._max:
                self._seen.popitem(last=False)
        return converted
