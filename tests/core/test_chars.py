"""The character metric and message validation."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragent_memory import InvalidMessagesError
from ragent_memory.core.chars import chars, clip, measured, validate_message, validate_messages


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


_leaves = st.sampled_from([None, True, 1.5, 7, 1 << 14_000, "", "x"])  # one int too long
_values = st.recursive(
    _leaves,
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(st.sampled_from(["k", 3]), inner, max_size=2)
    ),  # 3: a key not a string
    max_leaves=4,
)


@st.composite
def _messages(draw: st.DrawFn) -> Any:
    """A valid chat message of a usual shape (text, tool result, plain tool calls) with up
    to two changes, each setting or deleting one key of it, of a call or of a function."""
    role = draw(st.sampled_from(["user", "assistant", "tool", "system"]))
    message: dict[Any, Any] = {"role": role, "content": draw(st.sampled_from([None, "", "hi"]))}
    if role == "tool":
        message["tool_call_id"] = "c1"
    calls: list[dict[str, Any]] = []
    functions: list[dict[str, Any]] = []
    if role == "assistant" and draw(st.booleans()):
        for k in range(draw(st.integers(1, 2))):
            arguments = draw(st.sampled_from([None, "", "{}"]))
            function = {"name": "f", "arguments": arguments}
            functions.append(function)
            calls.append({"id": f"c{k}", "type": "function", "function": function})
        message["tool_calls"] = calls
    keys = st.sampled_from(["role", "content", "name", "tool_call_id", "tool_calls", "id"])
    keys |= st.sampled_from(["type", "function", "arguments", "extra"])
    for _ in range(draw(st.integers(0, 2))):
        target = draw(st.sampled_from([message, *calls, *functions]))
        key = draw(keys)
        if key in target and draw(st.booleans()):
            del target[key]
        else:
            target[key] = draw(_values | st.sampled_from(["robot", "tool", "assistant"]))
    return draw(st.sampled_from([message, message, message, [message], "text"]))


_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
_HUGE = 1 << 14_000  # an int too long to print


def _call(**changes: Any) -> dict[str, Any]:
    return {**_CALL, **changes}


def _function(**changes: Any) -> dict[str, Any]:
    return _call(function={**_CALL["function"], **changes})


@pytest.mark.parametrize(
    "message",
    [
        {"role": "tool", "tool_call_id": "", "content": "x"},
        {"role": "tool", "content": "x"},
        {"role": "tool", "tool_call_id": 5, "content": "x"},
        {"role": "user", "tool_call_id": [_HUGE], "content": "x"},
        {"role": "user", "name": {3: "x"}, "content": "a"},
        {"role": "user", "name": "bob", "content": "a", "tool_calls": None},
        {"role": "robot", "content": "a"},
        {"role": True, "content": "a"},
        {"content": "a"},
        {"role": "user", "content": 5},
        {"role": "user", "content": ["x"]},
        {"role": "user", "content": "a", "tool_calls": [_CALL]},
        {"role": "assistant", "content": "a", "tool_calls": "x"},
        {"role": "assistant", "content": "a", "tool_calls": ["x"]},
        {"role": "assistant", "content": "ab", "tool_calls": [_CALL, _call(id="c2")]},
        {"role": "assistant", "content": None, "tool_calls": [_call(extra=_HUGE)]},
        {"role": "assistant", "content": None, "tool_calls": [_call(type={3: 1})]},
        {"role": "assistant", "content": None, "tool_calls": [_call(id="")]},
        {"role": "assistant", "content": None, "tool_calls": [_call(id=None)]},
        {"role": "assistant", "content": None, "tool_calls": [_call(function="f")]},
        {"role": "assistant", "content": None, "tool_calls": [_function(arguments=5)]},
        {"role": "assistant", "content": None, "tool_calls": [_function(arguments=None)]},
        {"role": "assistant", "content": None, "tool_calls": [_function(name=None)]},
        {"role": "assistant", "content": None, "tool_calls": [_function(x=[_HUGE])]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "function": {"name": "f"}}],
        },
    ],
)
def test_measured_agrees_on_near_misses(message: dict[str, Any]) -> None:
    """Each rule the quick path of ``measured`` checks, broken once: the same answer as
    validate_message and chars."""
    _agree(message)


@given(_messages())
@settings(max_examples=600, deadline=None)
def test_measured_is_validate_then_chars(message: Any) -> None:
    """The one-pass check every new message goes through says what validate_message and chars
    say: the same size for a valid message, the same error for an invalid one."""
    _agree(message)


def _agree(message: Any) -> None:
    try:
        validate_message(message, 7)
    except InvalidMessagesError as err:
        with pytest.raises(InvalidMessagesError) as info:
            measured(message, 7)
        assert (info.value.index, str(info.value)) == (err.index, str(err))
        return
    assert measured(message, 7) == chars(message)
