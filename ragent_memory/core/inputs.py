"""Input normalisation: what SDKs hand out, accepted as chat dicts (docs/design.md §14b).

SDK pydantic objects (anything with ``model_dump``) and the ``developer`` role (OpenAI's newer
``system``) become plain chat dicts; plain dicts pass through, the caller's own list when
nothing needs converting, so an appending app's identity checks keep holding.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

from ragent_memory.core.chars import InputRole, Message, Role
from ragent_memory.errors import InvalidMessagesError

ALIASES: Final[Mapping[InputRole, Role]] = MappingProxyType({"developer": "system"})
# Chat dicts as they come: the app's own, or copies ``prepare`` handed out that it kept.
PLAIN_TYPES = frozenset({dict})


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


class Inputs:
    """The engine's input boundary: a list of messages in, chat dicts out, the caller's objects
    never touched. ``convert`` turns one message into a chat dict (a framework adapter passes
    its own)."""

    def __init__(self, convert: Callable[[Any], Any] = to_message) -> None:
        self._convert = convert

    def accept(self, messages: Any, *, plain: int = 0) -> Sequence[Message]:
        """``messages`` as chat dicts (the caller's own list when nothing needs converting).
        ``plain``: how many leading messages the caller already passed as plain chat dicts
        (the session's cursor checks those by identity), so only the rest is looked at."""
        if not isinstance(messages, list | tuple):
            raise InvalidMessagesError(
                None, f"expected a list of messages, got {type(messages).__name__}"
            )
        if not any(map(needs_conversion, messages[plain:] if plain else messages)):
            return messages
        return [self._convert(m) if needs_conversion(m) else m for m in messages]
