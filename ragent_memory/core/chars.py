"""The character metric (docs/design.md §2) and message validation (docs/design.md §3).

``chars(message)`` is the engine's only unit of size: the text of the content, plus the name and
arguments of each tool call, plus a fixed 2,000 per non-text part. Role and field names do not
count. Characters are a proxy for tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal, TypeAlias

from ragent_memory.errors import InvalidMessagesError
from ragent_memory.settings import NON_TEXT_PART_CHARS

Message = dict[str, Any]

# A message's role once the input boundary has read it (``developer`` arrives as ``system``).
Role: TypeAlias = Literal["system", "user", "assistant", "tool"]
# What a caller or a client may send: OpenAI's newer ``developer`` too.
InputRole: TypeAlias = Role | Literal["developer"]

ROLES: Final[frozenset[Role]] = frozenset({"system", "user", "assistant", "tool"})


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
    """Size of one message in characters (docs/design.md §2)."""
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
_CONTAINERS = (dict, list, tuple)


def _unencodable(value: Any, depth: int = 0, path: tuple[int, ...] = ()) -> str:
    """Why ``value`` cannot be digested as JSON ("" when it can): a cycle, nesting over
    MAX_DEPTH, an int too long to print, or a key that is not a string. Walks containers
    only, so a long text costs nothing. ``path``: ids of the containers above ``value``."""
    if isinstance(value, int):
        return "an integer too long to print" if value.bit_length() > MAX_INT_BITS else ""
    if not isinstance(value, _CONTAINERS):
        return ""
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} levels"
    if id(value) in path:
        return "it contains itself (a cycle)"
    bad_keys = [k for k in value if not isinstance(k, str)] if isinstance(value, dict) else []
    if bad_keys:
        return f"key {bad_keys[0]!r} is not a string"
    children = value.values() if isinstance(value, dict) else value
    path = (*path, id(value))
    return next(filter(None, (_unencodable(c, depth + 1, path) for c in children)), "")


def _content_problem(content: Any) -> str:
    if isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, Mapping):
                return f"content[{j}] is not a dict"
            if part.get("type") == "text" and not isinstance(part.get("text"), str):
                return f"content[{j}].text is not a string"
    elif content is not None and not isinstance(content, str):
        kind = type(content).__name__
        return f"content must be a string, a list of parts or None, got {kind}"
    return ""


def _call_problem(call: Any, where: str) -> str:
    if not isinstance(call, Mapping):
        return f"{where} is not a dict"
    if not isinstance(call.get("id"), str) or not call["id"]:
        return f"{where} has no 'id'"
    function = call.get("function")
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        return f"{where}.function.name is missing"
    arguments = function.get("arguments", "")
    if arguments is not None and not isinstance(arguments, str):
        return f"{where}.function.arguments is not a string"
    return ""


def _tools_problem(message: Mapping[str, Any], role: Any) -> str:
    call_id = message.get("tool_call_id")
    if role == "tool" and (not isinstance(call_id, str) or not call_id):
        return "tool message without 'tool_call_id'"
    tool_calls = message.get("tool_calls")
    if tool_calls is None:
        return ""
    if role != "assistant":
        return f"'tool_calls' on a {role} message"
    if not isinstance(tool_calls, list):
        return "'tool_calls' must be a list"
    problems = (_call_problem(call, f"tool_calls[{j}]") for j, call in enumerate(tool_calls))
    return next(filter(None, problems), "")


def validate_message(message: Any, index: int) -> None:
    """Raise InvalidMessagesError naming ``index`` when ``message`` is not a chat message."""
    if not isinstance(message, dict):
        raise InvalidMessagesError(index, f"expected a dict, got {type(message).__name__}")
    role = message.get("role")
    problem = _unencodable(message)
    if not problem and role is None:
        problem = "missing 'role'"
    elif not problem and (not isinstance(role, str) or role not in ROLES):
        problem = f"unknown role {role!r}"
    problem = problem or _content_problem(message.get("content")) or _tools_problem(message, role)
    if problem:
        raise InvalidMessagesError(index, problem)


def measured(message: Any, index: int) -> int:
    """``validate_message`` then ``chars``: the one look every new message gets."""
    validate_message(message, index)
    return chars(message)


def validate_messages(messages: Any, start: int = 0) -> Sequence[Message]:
    """Validate a chat history (a list or tuple, from ``start`` on) and return it."""
    if not isinstance(messages, list | tuple):
        raise InvalidMessagesError(
            None, f"expected a list of messages, got {type(messages).__name__}"
        )
    for index in range(start, len(messages)):
        validate_message(messages[index], index)
    return messages
