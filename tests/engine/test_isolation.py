"""What the caller gets is its own: changing a prepared message changes neither the caller's
history nor later turns; the history is read incrementally, yet edits are
caught on the very next prepare."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest
from fake_openai import FakeOpenAI
from openai import OpenAI
from sessions import CountingSummarizer, build_history

from ragent_memory import Settings
from ragent_memory.core.chars import chars
from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.store import SessionState


def _history() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "persona"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look at this"},
                {"type": "image_url", "image_url": {"url": "https://example.org/a.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "search_knowledge", "arguments": '{"q": "a"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
        {"role": "user", "content": "and?"},
    ]


def _decorate(messages: list[dict[str, Any]]) -> None:
    """What apps do to what they send: cache_control on parts, edited calls, popped keys."""
    messages[1]["content"][0]["cache_control"] = {"type": "ephemeral"}
    messages[1]["content"][1]["image_url"]["detail"] = "low"
    messages[2]["tool_calls"][0]["function"]["arguments"] = "{}"
    messages[2]["tool_calls"].append({"id": "x"})
    messages[3].pop("tool_call_id")
    messages[4]["content"] = "changed"


def test_decorating_the_output_changes_neither_history_nor_later_turns(
    make_engine: Callable[..., MemoryEngine],
) -> None:
    """Parts, tool calls and keys of a prepared message are fresh objects: decorating them
    leaves the caller's history as it was, and the next prepare sends the original again."""
    engine = make_engine()
    history = _history()
    before = copy.deepcopy(history)
    first = engine.prepare(history, session_id="s").messages
    _decorate(first)
    assert before == history
    second = engine.prepare(history, session_id="s").messages
    assert before == second
    _decorate(second)
    history.append({"role": "assistant", "content": "done"})
    third = engine.prepare(history, session_id="s").messages
    assert [*before, {"role": "assistant", "content": "done"}] == third


def test_decorating_an_engine_made_preview_does_not_stick(
    make_settings: Callable[..., Settings],
) -> None:
    """An oversized tool-call input is shown as a preview the engine made; editing that preview
    in the output does not reappear on later turns."""
    engine = MemoryEngine(make_settings(context_window_chars=80_000))
    try:
        history = _history()
        history[2]["tool_calls"][0]["function"]["arguments"] = '{"q": "' + "a" * 9_000 + '"}'
        first = engine.prepare(history, session_id="s")
        assert 1 == first.report.truncated
        shown = copy.deepcopy(first.messages[2])
        first.messages[2]["tool_calls"][0]["function"]["arguments"] = "tampered"
        first.messages[2]["tool_calls"][0]["function"]["extra"] = {"nested": True}
        second = engine.prepare(history, session_id="s")
        assert shown == second.messages[2]
    finally:
        engine.close()


@contextmanager
def _summarized(
    make_settings: Callable[..., Settings],
) -> Iterator[tuple[MemoryEngine, list[dict[str, Any]], SessionState]]:
    """An engine whose session "s" has just compacted: the history and the stored state."""
    settings = make_settings(context_window_chars=20_000)
    with MemoryEngine(settings, summarizer=CountingSummarizer()) as engine:
        history = [*build_history(60), {"role": "user", "content": "go on"}]
        assert engine.prepare(history, session_id="s").report.compacted
        state = engine.store.load_session("s")
        assert state is not None
        yield engine, history, state


def test_in_place_edit_of_a_covered_message_is_caught_before_the_next_summary(
    make_settings: Callable[..., Settings],
) -> None:
    """An edit in place of a message the summary covers (not shown any more) is caught when
    the next compaction is due, before a new generation builds on it: the summary is
    invalidated and rebuilt from the edited history."""
    with _summarized(make_settings) as (engine, history, state):
        covered = next(i for i in range(state.covered) if history[i]["role"] == "user" and i > 10)
        history[covered]["content"] = "an edit the summary never saw"
        history += build_history(40, seed=2)[1:]
        history.append({"role": "user", "content": "and now?"})
        engine.prepare(history, session_id="s")
        statuses = [r["status"] for r in engine.store.compactions("s")]
    assert ["applied", "invalidated"] == statuses[:2]


@pytest.mark.parametrize("where", [0, 1, -1])
@pytest.mark.parametrize("edit", ["content", "tool_calls"])
def test_in_place_edit_of_a_covered_message_is_seen_once_a_compaction_may_be_due(
    make_settings: Callable[..., Settings], edit: str, where: int
) -> None:
    """An edit in place of a covered message anywhere in the covered range (its content or
    tool_calls replaced in the same dict) is seen by the first prepare whose view may reach
    the compaction trigger (docs/design.md §5): the summary is dropped before anything builds on it.
    Turns below the trigger look at what the view shows, so their cost stays flat."""
    with _summarized(make_settings) as (engine, history, state):
        role = "user" if edit == "content" else "assistant"
        candidates = [
            i
            for i in range(1, state.covered)
            if history[i]["role"] == role and (edit == "content" or history[i].get("tool_calls"))
        ]
        covered = candidates[len(candidates) // 2 if where == 1 else where]
        if edit == "content":
            history[covered]["content"] = "an edit the summary never saw"
        else:
            call = history[covered]["tool_calls"][0]
            function = {**call["function"], "arguments": '{"q": "edited"}'}
            history[covered]["tool_calls"] = [{**call, "function": function}]
        history += build_history(40, seed=2)[1:]
        history.append({"role": "user", "content": "and now?"})
        engine.prepare(history, session_id="s")
        statuses = [r["status"] for r in engine.store.compactions("s")]
    assert ["applied", "invalidated"] == statuses[:2]


def test_verify_catches_an_edit_inside_a_content_part(
    make_settings: Callable[..., Settings],
) -> None:
    """An edit deep inside a content part of a covered message is invisible to identity
    checks; prepare(verify=True) compares digests: the summary is invalidated at once and
    rebuilt from the edited history in the same call."""
    settings = make_settings(context_window_chars=20_000)
    with MemoryEngine(settings, summarizer=CountingSummarizer()) as engine:
        history = [*build_history(60), {"role": "user", "content": "go on"}]
        history[3] = {"role": "user", "content": [{"type": "text", "text": "original words"}]}
        assert engine.prepare(history, session_id="s").report.compacted
        history[3]["content"][0]["text"] = "rewritten words"
        assert 1 == engine.prepare(history, session_id="s").report.generation
        verified = engine.prepare(history, session_id="s", verify=True).report
        statuses = [r["status"] for r in engine.store.compactions("s")]
    assert (True, 2) == (verified.compacted, verified.generation)
    assert ["applied", "invalidated", "applied"] == statuses


def test_an_edit_inside_a_shown_content_part_is_caught_on_the_next_turn(
    make_engine: Callable[..., MemoryEngine],
) -> None:
    """The copy handed out last turn no longer equals the edited message, so the engine looks
    at it again: the next prepare measures and sends the edit, without verify=True."""
    engine = make_engine()
    history = _history()
    before = engine.prepare(history, session_id="s").report.chars_raw
    history[1]["content"][0]["text"] = "look at this, and at the second page too"
    after = engine.prepare(history, session_id="s")
    assert before + len(", and at the second page too") == after.report.chars_raw
    assert history[1] == after.messages[1]


def test_untouched_copies_are_handed_out_again(make_engine: Callable[..., MemoryEngine]) -> None:
    """Only what changed is copied: a message neither the caller nor the engine changed comes
    back as the same copy, a decorated one as a fresh copy equal to the history."""
    engine = make_engine()
    history = _history()
    first = engine.prepare(history, session_id="s").messages
    first[3]["content"] = "decorated"
    history.append({"role": "assistant", "content": "done"})
    second = engine.prepare(history, session_id="s").messages
    assert (True, False) == (first[2] is second[2], first[3] is second[3])
    assert history == second


def _chat(count: int, start: int = 0) -> list[dict[str, Any]]:
    """``count`` messages of ~100 chars, user and assistant in turn, each a list of parts."""
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": [{"type": "text", "text": f"message {i} " + "w" * 90}],
        }
        for i in range(start, start + count)
    ]


MUTATIONS = {
    "set a part's key": lambda m: m["content"][0].__setitem__("text", "changed"),
    "append a part": lambda m: m["content"].append({"type": "text", "text": "more"}),
    "extend in place": lambda m: m["content"].__iadd__([{"type": "text", "text": "more"}]),
    "insert a part": lambda m: m["content"].insert(0, {"type": "text", "text": "first"}),
    "delete a part": lambda m: m["content"].__delitem__(0),
    "pop a part's key": lambda m: m["content"][0].pop("type"),
    "update a part": lambda m: m["content"][0].update(cache_control={"type": "ephemeral"}),
    "merge into a part": lambda m: m["content"][0].__ior__({"cache_control": {}}),
    "setdefault a key": lambda m: m.setdefault("name", "x"),
    "delete a key": lambda m: m.__delitem__("role"),
    "clear the message": lambda m: m.clear(),
}


@pytest.mark.parametrize("mutate", MUTATIONS.values(), ids=MUTATIONS.keys())
def test_a_change_deep_inside_an_old_copy_is_never_sent_again(
    make_engine: Callable[..., MemoryEngine], mutate: Callable[[dict[str, Any]], Any]
) -> None:
    """Far back in a long view (out of reach of the per-turn rotating check), a change
    anywhere inside a copy handed out is noticed on the next turn: it gets a fresh copy."""
    engine = make_engine()
    history = [{"role": "system", "content": "persona"}, *_chat(301)]
    first = engine.prepare(history, session_id="s").messages
    mutate(first[200])
    history += _chat(2, start=301)
    second = engine.prepare(history, session_id="s").messages
    assert history == second
    assert first[199] is second[199]  # what was not changed is handed out again


@pytest.mark.parametrize("edit", ["content", "tool_calls"])
def test_the_same_edit_to_a_copy_and_to_the_history_is_measured(
    make_engine: Callable[..., MemoryEngine], edit: str
) -> None:
    """The app makes the same edit to a copy it was handed and to its own message, far back
    in the view: the copy still equals the history, so comparing copies alone would miss it;
    the next prepare measures the edit (what the view shows is looked at in place)."""
    engine = make_engine()
    history = [{"role": "system", "content": "persona"}, *_chat(301)]
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    history[200] = {"role": "assistant", "content": "calling", "tool_calls": [call]}
    history[201:201] = [{"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    first = engine.prepare(history, session_id="s").messages
    if edit == "content":
        first[200]["content"] = history[200]["content"] = "calling " + "x" * 500
    else:
        longer = [{**call, "function": {"name": "f", "arguments": "{" + " " * 500 + "}"}}]
        first[200]["tool_calls"] = history[200]["tool_calls"] = longer
    history += _chat(2, start=301)
    second = engine.prepare(history, session_id="s")
    assert sum(map(chars, history)) == second.report.chars_raw
    assert history == second.messages


def _container_types(value: Any) -> set[type]:
    """The types of every dict and list in ``value``, itself included."""
    if isinstance(value, dict):
        children: Any = value.values()
    elif isinstance(value, list):
        children = value
    else:
        return set()
    return {type(value)}.union(*map(_container_types, children))


def test_copies_serialize_and_copy_as_plain_data(make_engine: Callable[..., MemoryEngine]) -> None:
    """What is handed out is plain dicts and lists: it encodes as the history does (json,
    orjson), and copies, deep copies and pickles like it."""
    engine = make_engine()
    history = _history()
    out = engine.prepare(history, session_id="s").messages
    assert {dict, list} == _container_types(out)
    assert json.dumps(history) == json.dumps(out)
    assert orjson.dumps(history) == orjson.dumps(out)
    for copied in (copy.deepcopy(out), pickle.loads(pickle.dumps(out))):
        assert history == copied
        assert {dict, list} == _container_types(copied)
    deep = copy.deepcopy(out)
    deep[1]["content"][0]["text"] = "mine now"  # not a handed copy
    assert out == engine.prepare(history, session_id="s").messages


def test_an_edit_deep_inside_an_old_shown_message_is_measured_before_a_compaction(
    make_settings: Callable[..., Settings],
) -> None:
    """An edit inside a content part of the caller's own message, far back in the view, may
    go unseen on quiet turns (the copy handed out still shows it as it was); the turn a
    compaction may start compares every copy with the history, so the summarizer reads, and
    the report measures, the history as it is now."""
    settings = make_settings(context_window_chars=20_000)
    with MemoryEngine(settings, summarizer=CountingSummarizer()) as engine:
        history = [{"role": "system", "content": "persona"}, *_chat(121)]
        assert not engine.prepare(history, session_id="s").report.compacted
        history[90]["content"][0]["text"] += " and more" * 40
        history += _chat(50, start=121)
        report = engine.prepare(history, session_id="s").report
    assert report.compacted
    assert sum(map(chars, history)) == report.chars_raw


def test_prepared_copies_go_through_the_openai_client_as_sent(
    make_engine: Callable[..., MemoryEngine],
) -> None:
    """The real ``openai`` client sends the copies handed out as the JSON of the history."""
    engine = make_engine()
    history = _history()
    prepared = engine.prepare(history, session_id="s").messages
    with FakeOpenAI() as server:
        server.reply("fine")
        client = OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
        client.chat.completions.create(model="m", messages=prepared)  # type: ignore[arg-type]
        client.close()
        (request,) = server.requests
    assert history == request.body["messages"]
