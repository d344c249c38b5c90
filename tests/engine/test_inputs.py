"""SDK message objects and the developer role are accepted as chat dicts (docs/design.md §14b)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessage
from openai.types.chat.chat_completion_message_function_tool_call import (
    ChatCompletionMessageFunctionToolCall,
    Function,
)

from ragent_memory import InvalidMessagesError, MemoryEngine
from ragent_memory.core.inputs import Inputs, to_message


def _sdk_history() -> list[Any]:
    call = ChatCompletionMessageFunctionToolCall(
        id="c1", type="function", function=Function(name="search_knowledge", arguments="{}")
    )
    return [
        {"role": "developer", "content": "You are terse."},
        {"role": "user", "content": "What is the refund window?"},
        ChatCompletionMessage(role="assistant", content=None, tool_calls=[call]),
        {"role": "tool", "tool_call_id": "c1", "content": "30 days."},
        ChatCompletionMessage(role="assistant", content="30 days."),
        {"role": "user", "content": "And for sale items?"},
    ]


def test_sdk_objects_and_developer_role_become_chat_dicts() -> None:
    """``model_dump(exclude_none=True)`` for pydantic objects; ``developer`` reads as ``system``."""
    history = _sdk_history()
    out = Inputs().accept(history)
    assert {"role": "system", "content": "You are terse."} == out[0]
    assert history[1] is out[1]  # plain dicts pass through untouched
    assert {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "search_knowledge", "arguments": "{}"},
            }
        ],
    } == out[2]
    assert {"role": "assistant", "content": "30 days."} == out[4]


def test_prepare_takes_sdk_objects_and_never_touches_them(
    make_engine: Callable[..., MemoryEngine],
) -> None:
    """The engine prepares an SDK history; the caller's objects and dicts stay as they were."""
    history = _sdk_history()
    before = copy.deepcopy(history)
    prepared = make_engine().prepare(history, session_id="s1", user_id="u1")
    assert before == history
    assert ["system", "user", "assistant", "tool", "assistant", "user"] == [
        m["role"] for m in prepared.messages
    ]
    # Chat dicts, not SDK objects: a JSON encoder sends the copies handed out as they are.
    assert all(isinstance(m, dict) for m in prepared.messages)
    assert prepared.messages == json.loads(json.dumps(prepared.messages))


def test_developer_message_is_a_leading_system_message(
    make_engine: Callable[..., MemoryEngine],
) -> None:
    """The memory block goes after a leading developer message, as after a system one."""
    engine = make_engine()
    history = [
        {"role": "developer", "content": "persona"},
        {"role": "user", "content": "My name is Ada Lovelace."},
        {"role": "assistant", "content": "Hi Ada."},
        {"role": "user", "content": "I live in Lisbon."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "I prefer short answers."},
    ]
    engine.after_turn(history, session_id="s1", user_id="u1")
    engine.flush()
    prepared = engine.prepare(history, session_id="s2", user_id="u1")
    assert prepared.report.memory_chars > 0
    assert "system" == prepared.messages[0]["role"]
    assert "Ada Lovelace" in prepared.messages[1]["content"]


@pytest.mark.parametrize(
    ("item", "problem"),
    [(object(), "expected a dict, got object"), ({"role": "wizard"}, "unknown role 'wizard'")],
)
def test_what_is_not_a_message_is_still_named(
    make_engine: Callable[..., MemoryEngine], item: Any, problem: str
) -> None:
    """Objects without ``model_dump`` and unknown roles fail validation with their index."""
    history = [{"role": "user", "content": "hi"}, item]
    with pytest.raises(InvalidMessagesError, match=problem) as caught:
        make_engine().prepare(history, session_id="s1")
    assert 1 == caught.value.index


def test_to_message_leaves_plain_messages_alone() -> None:
    """A plain dict with a standard role is returned as the very same object."""
    message = {"role": "user", "content": "hi"}
    assert message is to_message(message)


class _Role(str):
    """A role whose comparison raises: the whole-list check must not be the one to fail."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no comparing me")

    __hash__ = str.__hash__


def test_the_whole_list_check_finds_one_message_to_convert_anywhere() -> None:
    """A long plain history passes through as the caller's own list; one developer message or
    SDK object at any position is still converted, and an odd role is left for validation."""
    plain = [{"role": "user", "content": f"q{i}"} for i in range(300)]
    inputs = Inputs()
    assert inputs.accept(plain) is plain
    for at in (0, 150, 299):
        history = [*plain[:at], {"role": "developer", "content": "d"}, *plain[at + 1 :]]
        assert "system" == inputs.accept(history)[at]["role"]
        history = [*plain[:at], ChatCompletionMessage(role="assistant", content="a"), *plain[at:]]
        assert {"role": "assistant", "content": "a"} == inputs.accept(history)[at]
    odd = [*plain, {"role": _Role("user"), "content": "x"}]
    assert odd[300] is inputs.accept(odd)[300]


def test_copies_prepare_handed_out_count_as_plain_dicts(
    make_engine: Callable[..., MemoryEngine],
) -> None:
    """An app that keeps the prepared messages as its history passes them back untouched:
    no conversion, its own list, so the next prepare reads only what is new."""
    engine = make_engine()
    prepared = engine.prepare([{"role": "user", "content": "hi"}], session_id="s1")
    history = [*prepared.messages, {"role": "assistant", "content": "hello"}]
    assert Inputs().accept(history) is history
