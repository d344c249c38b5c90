"""The character metric (DESIGN §2) and message validation (DESIGN §3).

``chars(message)`` is the engine's only unit of size: the text of the content, plus the name and
arguments of each tool call, plus a fixed 2,000 per non-text part. Role and field names do not
count. Characters are a proxy for tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ragent_memory.errors import InvalidMessagesError
from ragent_memory.settings import NON_TEXT_PART_CHARS

Message = dict[str, Any]

ROLES = frozenset({"system", "user", "assistant", "tool"})


def text_of(message: Mapping[str, Any]) -> str:
    """The text of a message's content: the string, or the text parts joined by newlines."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(
        part["text"] for part in content if isinstance(part, Mapping) and part.get("type") == "text"
    )


def chars(message: Mapping[str, Any]) -> int:
    """Size of one message in characters (DESIGN §2)."""
    total = 0
    content = message.get("content")
    if isinstance(content, str):
        total += len(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                total += len(part.get("text") or "")
            else:
                total += NON_TEXT_PART_CHARS
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        total += len(function.get("name") or "") + len(function.get("arguments") or "")
    return total


def total_chars(messages: Iterable[Mapping[str, Any]]) -> int:
    return sum(chars(m) for m in messages)


def clip(text: str, max_chars: int) -> str:
    """``text`` cut to at most ``max_chars`` characters, an ellipsis marking the cut."""
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


MAX_DEPTH = 64  # nesting deeper than this in a message is refused (JSON encoders recurse)
MAX_INT_BITS = 13_000  # ~3,900 digits: Python refuses to print ints over 4,300 digits
_LEAVES = frozenset({str, type(None), bool, float})  # values with nothing inside to check
_CONTAINERS = (dict, list, tuple)
_WALKED = (dict, list, tuple, int)


def _unencodable(value: Any, depth: int = 0, path: list[int] | None = None) -> str:
    """Why ``value`` cannot be digested as JSON ("" when it can): a cycle, nesting over
    MAX_DEPTH, an int too long to print, or a key that is not a string. Walks containers
    only, so a long text costs nothing. ``path``: ids of the containers above ``value``."""
    if isinstance(value, int):
        return "an integer too long to print" if value.bit_length() > MAX_INT_BITS else ""
    if not isinstance(value, _CONTAINERS):
        return ""
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} levels"
    if path is None:
        path = []
    elif id(value) in path:
        return "it contains itself (a cycle)"
    children: Iterable[Any] = value
    if isinstance(value, dict):
        for key in value:
            if type(key) is not str and not isinstance(key, str):
                return f"key {key!r} is not a string"
        children = value.values()
    path.append(id(value))
    try:
        for child in children:
            if type(child) not in _LEAVES and isinstance(child, _WALKED):
                problem = _unencodable(child, depth + 1, path)
                if problem:
                    return problem
    finally:
        path.pop()
    return ""


def _flat(message: dict[Any, Any]) -> bool:
    """Only string keys and values that need no walk (the usual text message): nothing in it
    can be unencodable."""
    for key, value in message.items():
        if type(key) is not str or type(value) not in _LEAVES:
            return False
    return True


def validate_message(message: Any, index: int) -> None:
    """Raise InvalidMessagesError naming ``index`` when ``message`` is not a chat message."""
    if not isinstance(message, dict):
        raise InvalidMessagesError(index, f"expected a dict, got {type(message).__name__}")
    problem = "" if _flat(message) else _unencodable(message)
    if problem:
        raise InvalidMessagesError(index, problem)
    role = message.get("role")
    if role is None:
        raise InvalidMessagesError(index, "missing 'role'")
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidMessagesError(index, f"unknown role {role!r}")
    content = message.get("content")
    if isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, Mapping):
                raise InvalidMessagesError(index, f"content[{j}] is not a dict")
            if part.get("type") == "text" and not isinstance(part.get("text"), str):
                raise InvalidMessagesError(index, f"content[{j}].text is not a string")
    elif content is not None and not isinstance(content, str):
        raise InvalidMessagesError(
            index,
            f"content must be a string, a list of parts or None, got {type(content).__name__}",
        )
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidMessagesError(index, "tool message without 'tool_call_id'")
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if role != "assistant":
            raise InvalidMessagesError(index, f"'tool_calls' on a {role} message")
        if not isinstance(tool_calls, list):
            raise InvalidMessagesError(index, "'tool_calls' must be a list")
        for j, call in enumerate(tool_calls):
            where = f"tool_calls[{j}]"
            if not isinstance(call, Mapping):
                raise InvalidMessagesError(index, f"{where} is not a dict")
            if not isinstance(call.get("id"), str) or not call["id"]:
                raise InvalidMessagesError(index, f"{where} has no 'id'")
            function = call.get("function")
            if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
                raise InvalidMessagesError(index, f"{where}.function.name is missing")
            arguments = function.get("arguments", "")
            if arguments is not None and not isinstance(arguments, str):
                raise InvalidMessagesError(index, f"{where}.function.arguments is not a string")


# The keys the quick path of ``measured`` knows (any other key takes the full path).
_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_call_id", "tool_calls"})
_TEXTS = frozenset({str, type(None)})  # content, arguments: as the quick paths take them


def measured(message: Any, index: int) -> int:
    """``validate_message`` then ``chars``, in one look at the usual shapes: a message of the
    usual keys with string (or no) content, and an assistant's plain tool calls. Anything
    else, and anything invalid, takes the full path, so an error is ``validate_message``'s.
    (A few known keys read one by one cost less than a generic walk of a small dict.)"""
    if type(message) is dict and _MESSAGE_KEYS.issuperset(message):
        role = message.get("role")
        content = message.get("content")
        call_id = message.get("tool_call_id")
        if (
            type(content) in _TEXTS
            and type(message.get("name")) in _LEAVES
            and type(role) is str
            and (type(call_id) is str and call_id if role == "tool" else type(call_id) in _LEAVES)
            and role in ROLES
        ):
            size = len(content) if content else 0
            calls = message.get("tool_calls")
            if calls is None:
                return size
            if role == "assistant" and type(calls) is list:
                calls_size = _plain_calls(calls)
                if calls_size >= 0:
                    return size + calls_size
    validate_message(message, index)
    return chars(message)


def _plain_calls(calls: list[Any]) -> int:
    """The chars of ``calls`` when each is a dict of a non-empty string ``id``, an optional
    leaf ``type`` and a ``function`` dict of a string ``name`` and optional string
    ``arguments``, and nothing else: nothing in them needs a walk. -1 otherwise."""
    total = 0
    for call in calls:
        if type(call) is not dict:
            return -1
        function = call.get("function")
        call_id = call.get("id")
        if (
            type(function) is not dict
            or type(call_id) is not str
            or not call_id
            or len(call) != 2 + ("type" in call)
            or type(call.get("type")) not in _LEAVES
        ):
            return -1
        name = function.get("name")
        arguments = function.get("arguments")
        if (
            type(name) is not str
            or type(arguments) not in _TEXTS
            or len(function) != 1 + ("arguments" in function)
        ):
            return -1
        total += len(name) + (len(arguments) if arguments else 0)
    return total


def validate_messages(messages: Any, start: int = 0) -> Sequence[Message]:
    """Validate a chat history (from ``start`` on) and return it as a sequence.

    Accepts a list or tuple; anything else (a string, a dict, None) is rejected.
    """
    if not isinstance(messages, list | tuple):
        raise InvalidMessagesError(
            None, f"expected a list of messages, got {type(messages).__name__}"
        )
    for index in range(start, len(messages)):
        validate_message(messages[index], index)
    return messages
