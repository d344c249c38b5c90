"""The character metric and message validation."""

from __future__ import annotations

from typing import Any

import pytest

from ragent_memory import InvalidMessagesError
from ragent_memory.chars import chars, clip, validate_messages


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"role": "user", "content": "hello"}, 5),
        ({"role": "user", "content": "你好世界"}, 4),
        ({"role": "assistant", "content": None}, 0),
        (
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "ab"},
                    {"type": "image_url", "image_url": {"url": "x"}},
                ],
            },
            2002,
        ),
        (
            {
                "role": "assistant",
                "content": "ok",
                "tool_calls": [
                    {
                        "id": "1",
                        "type": "function",
                        "function": {"name": "search", "arguments": "{}"},
                    }
                ],
            },
            2 + 6 + 2,
        ),
        ({"role": "tool", "tool_call_id": "1", "content": "x" * 10}, 10),
    ],
)
def test_chars(message: dict[str, Any], expected: int) -> None:
    """Text, tool-call names and arguments count; non-text parts count 2,000; roles do not."""
    assert expected == chars(message)


@pytest.mark.parametrize(
    ("messages", "index", "fragment"),
    [
        ("x", None, "expected a list"),
        (None, None, "expected a list"),
        ([{"role": "user", "content": "a"}, "b"], 1, "expected a dict"),
        ([{"content": "a"}], 0, "missing 'role'"),
        ([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}], 1, "unknown role"),
        ([{"role": "user", "content": 5}], 0, "content must be"),
        ([{"role": "user", "content": [{"type": "text", "text": 3}]}], 0, "content[0].text"),
        ([{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}], 1, "tool_call_id"),
        ([{"role": "assistant", "tool_calls": [{"type": "function"}]}], 0, "tool_calls[0]"),
    ],
)
def test_invalid_messages_name_the_index(messages: Any, index: int | None, fragment: str) -> None:
    """Garbage raises InvalidMessagesError (a ValueError) naming the index and the problem."""
    with pytest.raises(InvalidMessagesError) as info:
        validate_messages(messages)
    assert index == info.value.index
    assert fragment in str(info.value)
    if index is not None:
        assert f"messages[{index}]" in str(info.value)


@pytest.mark.parametrize(
    ("text", "max_chars", "expected"),
    [
        ("hello", 5, "hello"),
        ("hello!", 5, "hell…"),
        ("你好世界啊", 3, "你好…"),
        ("", 1, ""),
    ],
)
def test_clip(text: str, max_chars: int, expected: str) -> None:
    """Text over max_chars keeps max_chars - 1 of its characters and an ellipsis."""
    assert expected == clip(text, max_chars)
