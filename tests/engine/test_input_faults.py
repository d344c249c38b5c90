"""Every wrong input a caller can pass is an InvalidMessagesError naming the index or the
field, from prepare and after_turn alike."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest

from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.errors import InvalidMessagesError


def cyclic() -> dict[str, Any]:
    message: dict[str, Any] = {"role": "user", "content": "x"}
    message["self"] = message
    return message


def deep() -> list[Any]:
    nested: list[Any] = []
    for _ in range(5_000):
        nested = [nested]
    return nested


OK = {"role": "user", "content": "fine"}

BAD_MESSAGES = [
    ("role is a list", [{"role": []}], 0, "role"),
    ("role is a dict", [OK, {"role": {}}], 1, "role"),
    ("a key that is not a string", [{"role": "user", "content": "x", 1: 2}], 0, "key 1"),
    ("a mapping proxy", [types.MappingProxyType({"role": "user", "content": "x"})], 0, "dict"),
    ("a cycle", [OK, cyclic()], 1, "cycle"),
    ("an int over 4,300 digits", [{"role": "user", "content": "x", "n": 10**5000}], 0, "integer"),
    ("nesting too deep", [{"role": "user", "content": "x", "d": deep()}], 0, "nested"),
]


@pytest.mark.parametrize(
    ("messages", "index", "names"),
    [case[1:] for case in BAD_MESSAGES],
    ids=[c[0] for c in BAD_MESSAGES],
)
@pytest.mark.parametrize("call", ["prepare", "after_turn"])
def test_wrong_messages_raise_invalid_messages_naming_the_index(
    make_engine: Callable[..., MemoryEngine],
    messages: list[Any],
    index: int,
    names: str,
    call: str,
) -> None:
    """Messages TypeError, ValueError or RecursionError used to escape from."""
    engine = make_engine()
    with pytest.raises(InvalidMessagesError) as caught:
        getattr(engine, call)(messages, session_id="s1", user_id="u1")
    assert index == caught.value.index
    assert names in str(caught.value)


@pytest.mark.parametrize("user_id", [2**63, 5, ["a"], b"x", ""])
@pytest.mark.parametrize("call", ["prepare", "after_turn"])
def test_a_wrong_user_id_is_refused_the_same_by_prepare_and_after_turn(
    make_engine: Callable[..., MemoryEngine], user_id: Any, call: str
) -> None:
    """user_id is checked in prepare exactly as in after_turn."""
    engine = make_engine()
    with pytest.raises(InvalidMessagesError, match="user_id"):
        getattr(engine, call)([OK], session_id="s1", user_id=user_id)


def test_a_refused_history_leaves_the_session_usable(
    make_engine: Callable[..., MemoryEngine],
) -> None:
    """After a refused call, the same session goes on with a good history."""
    engine = make_engine()
    with pytest.raises(InvalidMessagesError):
        engine.prepare([OK, cyclic()], session_id="s1")
    assert [OK] == engine.prepare([OK], session_id="s1").messages


def test_a_part_shared_twice_is_no_cycle(make_engine: Callable[..., MemoryEngine]) -> None:
    """The same dict used twice in a message (not inside itself) is accepted."""
    part = {"type": "text", "text": "same"}
    message = {"role": "user", "content": [part, part]}
    assert 2 == len(make_engine().prepare([message], session_id="s1").messages[0]["content"])


def test_after_turn_without_a_user_validates_what_is_new_and_all_of_a_rebuilt_history(
    make_engine: Callable[..., MemoryEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An app appending to its list gets only its new messages validated each turn; a history
    whose last message is another object is validated whole, so a bad earlier one is named."""
    import ragent_memory.engine.memory_engine as engine_module

    starts: list[int] = []
    real = engine_module.validate_messages

    def counting(messages: Any, start: int = 0) -> Any:
        starts.append(start)
        return real(messages, start)

    monkeypatch.setattr(engine_module, "validate_messages", counting)
    engine = make_engine()
    plain: list[int] = []
    accept = engine._inputs.accept

    def recording(messages: Any, **kwargs: Any) -> Any:
        plain.append(kwargs.get("plain", 0))
        return accept(messages, **kwargs)

    monkeypatch.setattr(engine._inputs, "accept", recording)
    history: list[Any] = [dict(OK) for _ in range(5)]
    engine.after_turn(history, session_id="s1")
    history += [{"role": "assistant", "content": "a"}, dict(OK)]
    engine.after_turn(history, session_id="s1")
    assert [0, 5] == starts
    assert [0, 5] == plain  # only the new messages are looked at for converting too
    with pytest.raises(InvalidMessagesError) as caught:
        engine.after_turn([*history[:2], {"role": []}, *history[3:]], session_id="s1")
    assert 2 == caught.value.index
    with pytest.raises(InvalidMessagesError) as caught:  # a new last object: all read again
        engine.after_turn([{"role": []}, *history[1:6], dict(OK)], session_id="s1")
    assert 0 == caught.value.index


def test_after_turn_keeps_its_own_copy_of_what_it_validated(
    make_engine: Callable[..., MemoryEngine],
) -> None:
    """What after_turn remembers of a session is its own copy: a bad message the caller
    appends to (or puts into) the list it passed is found on the next call, and a call that
    fails validation never lets a later call skip the bad message."""
    engine = make_engine()
    history: list[Any] = [dict(OK) for _ in range(3)]
    engine.after_turn(history, session_id="s1")
    history.append({"role": []})
    for _ in range(2):
        with pytest.raises(InvalidMessagesError) as caught:
            engine.after_turn(history, session_id="s1")
        assert 3 == caught.value.index
    history[3] = dict(OK)
    engine.after_turn(history, session_id="s1")
    history[1] = {"role": []}  # a replaced dict: the list no longer equals what was kept
    with pytest.raises(InvalidMessagesError) as caught:
        engine.after_turn(history, session_id="s1")
    assert 1 == caught.value.index
