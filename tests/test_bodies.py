"""Request bodies parsed by their new tail (``ragent_memory.serve.bodies``): always the whole parse."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sessions import tool_loop

from ragent_memory.serve.bodies import (
    _MAX_DIFFERENT,
    BodyCache,
    BodyEncoder,
    BodyError,
    _Known,
    _proves,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": 'finds [things]; "quoted" ] and }',
            "parameters": {"type": "object", "required": ["q"], "properties": {"q": {}}},
        },
    }
]
TRICKY = [
    'a "quoted" ], "model": "x"} word',
    'back\\slash \\" and ]]]',
    '{"role": "user"}]}',
    "ünïcödé ✓ \n\t",
]


def sdk_body(messages: list[dict[str, Any]], **extra: Any) -> bytes:
    """Keys in the order the openai SDK sends them: messages first, tools after."""
    return json.dumps({"messages": messages, "model": "m", **extra, "tools": TOOLS}).encode()


def conversation(turns: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for turn in range(turns):
        history.append({"role": "user", "content": f"{TRICKY[turn % 4]} #{turn}"})
        history.append({"role": "assistant", "content": f"reply {turn}"})
    return history


def test_appended_messages_are_parsed_alone_and_earlier_objects_reused() -> None:
    """Each body that extends the last one is parsed by its tail; the result equals the
    whole parse, and the earlier messages are the very objects returned before."""
    cache = BodyCache()
    history = conversation(12)
    previous: list[Any] = []
    for size in range(1, len(history) + 1):
        raw = sdk_body(history[:size])
        body = cache.parse("s", raw)
        assert orjson.loads(raw) == body
        assert all(a is b for a, b in zip(previous, body["messages"], strict=False))
        previous = body["messages"]
    # the first body is parsed whole, the second proves the split, the rest are tails
    assert len(history) - 1 == cache.tail_parses


@pytest.mark.parametrize(
    "change",
    [
        "edit an old message",
        "drop the last message",
        "another model",
        "keys reordered",
        "other whitespace",
        "a new top-level key",
        "the stream flag added",
        "a tail that closes the array",
    ],
)
def test_anything_but_an_append_is_parsed_whole(change: str) -> None:
    """A body that is not the last one plus messages falls back to the whole parse."""
    cache = BodyCache()
    history = conversation(3)
    for size in (4, 5):  # two bodies: the second proves the split
        cache.parse("s", sdk_body(history[:size]))
    longer = history[:6]
    raw = {
        "edit an old message": sdk_body([*history[:2], {"role": "user", "content": "x"}]),
        "drop the last message": sdk_body(history[:4]),
        "another model": sdk_body(longer).replace(b'"model": "m"', b'"model": "n"'),
        "keys reordered": json.dumps({"model": "m", "messages": longer, "tools": TOOLS}).encode(),
        "other whitespace": json.dumps(
            {"messages": longer, "model": "m", "tools": TOOLS}, indent=1
        ).encode(),
        "a new top-level key": sdk_body(longer, temperature=0.5),
        "the stream flag added": sdk_body(longer, stream=True),
        "a tail that closes the array": sdk_body(history[:5]).replace(
            b'], "model"', b', {"role": "user", "content": "q"}], "x": [1], "model"', 1
        ),
    }[change]
    before = cache.tail_parses
    assert orjson.loads(raw) == cache.parse("s", raw)
    assert before == cache.tail_parses


def test_a_wrong_split_is_refuted() -> None:
    """The proof rejects an end offset that is not just past the last message."""
    raw = sdk_body(conversation(2))
    body = orjson.loads(raw)
    close = raw.index(b'], "model"')
    assert _proves(_Known(raw, body, close, close, proved=False))
    inside = raw.index(b"reply 1") + 3  # inside a string
    assert not _proves(_Known(raw, body, inside, close, proved=False))
    before_last = raw.rindex(b", {")  # before the last message
    assert not _proves(_Known(raw, body, before_last, close, proved=False))


def test_a_lookalike_split_is_never_relied_on() -> None:
    """A duplicated key makes another ``]`` look like the end of ``messages``; the proof
    refutes it, so growing the other array is not read as new messages."""
    cache = BodyCache()
    first = b'{"messages": [{"role": "user", "content": "q"}], "model": [1], "model": "m"}'
    grown = first.replace(b"[1]", b'[1, {"role": "user", "content": "x"}]')
    assert orjson.loads(first) == cache.parse("s", first)
    assert orjson.loads(grown) == cache.parse("s", grown)
    assert 0 == cache.tail_parses


def test_no_session_key_means_no_reuse_and_bad_bodies_say_what_is_wrong() -> None:
    """Without a key every body is parsed whole; malformed bodies raise a one-line error."""
    cache = BodyCache()
    raw = sdk_body(conversation(2))
    assert cache.parse(None, raw) == cache.parse(None, raw)
    assert 0 == cache.tail_parses
    for bad, says in [
        (b"{not json", "not JSON"),
        (b"[1]", "expected a JSON object"),
        (b'{"messages": 3}', "'messages' must be a list"),
    ]:
        with pytest.raises(BodyError, match=says):
            cache.parse("s", bad)


def test_the_cache_is_bounded_by_sessions_and_bytes() -> None:
    """The oldest sessions are forgotten first; a body over the byte bound is not kept."""
    raw = sdk_body(conversation(2))
    cache = BodyCache(max_sessions=2, max_bytes=3 * len(raw))
    for key in ("a", "b", "c"):
        cache.parse(key, raw)
    assert ["b", "c"] == list(cache._known)
    small = BodyCache(max_bytes=len(raw) - 1)
    small.parse("a", raw)
    assert [] == list(small._known)


_text = st.text(alphabet=st.sampled_from(list('ab ]["}{,:\\\n✓')), max_size=8)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": _text}
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["append", "append", "append", "edit", "model", "indent"]),
            st.lists(_message, min_size=0, max_size=3),
        ),
        min_size=1,
        max_size=12,
    ),
    st.booleans(),
)
def test_any_sequence_of_bodies_parses_as_the_whole_parse(
    steps: list[tuple[str, list[dict[str, Any]]]], messages_last: bool
) -> None:
    """Whatever a session sends, in whatever order and layout, parse == orjson.loads."""
    cache = BodyCache()
    history: list[dict[str, Any]] = []
    model, indent = "m", None
    for op, new in steps:
        if op == "edit" and history:
            history[0] = {"role": "user", "content": "edited"}
        elif op == "model":
            model += "]"
        elif op == "indent":
            indent = None if indent else 2
        history = [*history, *new]
        fields: dict[str, Any] = {"model": model, "tools": TOOLS}
        document = (
            {**fields, "messages": history} if messages_last else {"messages": history, **fields}
        )
        raw = json.dumps(document, indent=indent, ensure_ascii=not messages_last).encode()
        assert orjson.loads(raw) == cache.parse("s", raw)


def test_adopted_objects_are_handed_back_and_counted() -> None:
    """After ``adopt`` the next extension reuses the caller's (equal) objects, and ``read``
    says how many leading messages are reused; a whole parse reuses none."""
    cache = BodyCache()
    history = conversation(3)
    body, reused = cache.read("s", sdk_body(history[:3]))
    assert 0 == reused
    messages = body["messages"]
    mine = dict(messages[1])
    messages[1] = mine
    cache.adopt("s", messages)
    raw = sdk_body(history[:5])
    body, reused = cache.read("s", raw)
    assert 3 == reused
    assert orjson.loads(raw) == body
    assert body["messages"][1] is mine
    cache.adopt("s", body["messages"][:2])  # not the last body's messages: ignored
    raw = sdk_body(history[:6])
    body, reused = cache.read("s", raw)
    assert (5, 6) == (reused, len(body["messages"]))
    assert orjson.loads(raw) == body
    edited = [*history[:6], {"role": "user", "content": "new"}]
    edited[2] = {"role": "assistant", "content": "edited"}
    body, reused = cache.read("s", sdk_body(edited))
    assert 0 == reused
    assert body["messages"][1] is not mine


def test_a_tail_that_is_not_json_is_a_malformed_body() -> None:
    """New items without their comma make an invalid document: an error, not a tail."""
    cache = BodyCache()
    history = conversation(2)
    for size in (2, 3):
        cache.parse("s", sdk_body(history[:size]))
    missing_comma = sdk_body(history[:3]).replace(b'}], "model"', b'} 12], "model"')
    with pytest.raises(BodyError, match="not JSON"):
        cache.parse("s", missing_comma)


# ---------------------------------------------------------------------- encoding


def upstream_body(messages: list[Any], *, tools: bool = True) -> dict[str, Any]:
    """As the proxy builds it: the app's keys around ``messages``, its tools (and ours)."""
    body: dict[str, Any] = {"model": "m", "messages": messages, "temperature": 0.5}
    if tools:
        body["tools"] = TOOLS
    return body


def test_appended_messages_are_encoded_alone() -> None:
    """Each body whose messages extend the last ones reuses their JSON, byte for byte the
    whole encode; the first body, another session and a shorter list are encoded whole."""
    encoder = BodyEncoder()
    history = conversation(10)
    for size in range(1, len(history) + 1):
        body = upstream_body(history[:size])
        assert orjson.dumps(body) == encoder.encode("s", body)
    assert len(history) - 1 == encoder.reused
    for key, size in (("other", 5), ("s", 7), (None, 8), (None, 9)):
        body = upstream_body(history[:size], tools=size % 2 == 0)
        assert orjson.dumps(body) == encoder.encode(key, body)
    assert len(history) - 1 == encoder.reused  # none of these reused anything
    grown = history[:3]  # a tool round grows the very list encoded before
    encoder.encode("round", upstream_body(grown))
    grown += history[3:5]
    assert orjson.dumps(upstream_body(grown)) == encoder.encode("round", upstream_body(grown))


@pytest.mark.parametrize(
    ("change", "reused"),
    [
        ("equal copy", True),  # the engine rebuilds a message equal to the last one
        ("other content", False),
        ("other key order", False),  # equal as dicts, not as JSON
        ("float for int", False),  # 1 == 1.0, not as JSON
        ("many equal copies", False),  # a rebuilt view: encoded whole
    ],
)
def test_an_earlier_message_that_is_another_object(change: str, reused: bool) -> None:
    """An earlier position holding another object reuses the last JSON only when that
    object encodes to the same bytes; every encode equals the whole encode."""
    encoder = BodyEncoder()
    history: list[dict[str, Any]] = [
        *conversation(_MAX_DIFFERENT),
        {"role": "user", "content": "n", "n": 1},
        {"role": "assistant", "content": "last"},  # the last one: see the recall block test
    ]
    encoder.encode("s", upstream_body(history))
    changed = [*history, {"role": "assistant", "content": "more"}]
    if change == "equal copy":
        changed[1] = dict(changed[1])
    elif change == "other content":
        changed[1] = {**changed[1], "content": "edited"}
    elif change == "other key order":
        changed[1] = dict(reversed(changed[1].items()))
    elif change == "float for int":
        changed[len(history) - 2] = {**changed[len(history) - 2], "n": 1.0}
    else:
        changed[: _MAX_DIFFERENT + 1] = [dict(m) for m in changed[: _MAX_DIFFERENT + 1]]
    body = upstream_body(changed)
    assert orjson.dumps(body) == encoder.encode("s", body)
    assert reused == (encoder.reused == 1)


def test_a_last_message_sent_with_a_recall_block_is_encoded_again_alone() -> None:
    """The engine sends the final user message with the turn's recall block on a copy, and
    its view holds it without: the next body reuses the JSON up to that message, which is
    encoded again with what follows, byte for byte the whole encode; so is a last message
    that is another object (equal or not) in a list as long as the last one."""
    encoder = BodyEncoder()
    view = [*conversation(6), {"role": "user", "content": "and now?"}]
    answer = {"role": "assistant", "content": "x"}
    asked = {"role": "user", "content": "y"}

    def with_block(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        text = {"type": "text", "text": messages[-1]["content"]}
        block = {"type": "text", "text": '[recall] ü ] "quoted"'}
        return [*messages[:-1], {**messages[-1], "content": [block, text]}]

    for sent in (
        with_block(view),
        with_block([*view, answer, asked]),  # the view holds "and now?" without its block
        [*view, answer, asked],  # no block this time: "y" is the view's own
        [*view, answer, dict(asked)],  # an equal copy
        [*view, answer, {"role": "user", "content": "z"}],  # another message, same length
        [*view, answer, asked, answer],
    ):
        body = upstream_body(sent, tools=True)
        assert orjson.dumps(body) == encoder.encode("s", body)
    assert 5 == encoder.reused
    for sent in ([], [asked], [answer]):  # shorter: whole; none before; the only one replaced
        body = upstream_body(sent)
        assert orjson.dumps(body) == encoder.encode("s", body)
    assert 6 == encoder.reused


def test_a_turns_block_kept_through_its_tool_loop_is_encoded_again_from_its_message() -> None:
    """The turn's recall block stays on its user message through the turn's tool loop and is
    gone from it on the next turn, a few positions back: the JSON is reused up to that
    message, which is encoded again with all after it, byte for byte the whole encode."""
    encoder = BodyEncoder()
    view = [*conversation(12), {"role": "user", "content": "and now?"}]
    block = {"type": "text", "text": '[recall] ü ] "quoted"'}
    shown = {**view[-1], "content": [block, {"type": "text", "text": "and now?"}]}
    call, result = tool_loop("c1", "found")
    answer = {"role": "assistant", "content": "done"}
    asked = {"role": "user", "content": [block, {"type": "text", "text": "next?"}]}
    for sent in (
        [*view[:-1], shown],
        [*view[:-1], dict(shown), call, result],  # the block again, on an equal copy
        [*view[:-1], dict(shown), call, result, *tool_loop("c2", "more")],
        [*view, call, result, *tool_loop("c2", "more"), answer, asked],  # gone: 5 back
    ):
        body = upstream_body(sent, tools=True)
        assert orjson.dumps(body) == encoder.encode("s", body)
    assert 3 == encoder.reused
    long_run = [*view, *(m for i in range(12) for m in tool_loop(f"x{i}", "r"))]
    encoder.encode("t", upstream_body(long_run))  # encoded whole: only the last start known
    edited = [*long_run[:-3], {"role": "assistant", "content": "other"}, *long_run[-2:]]
    body = upstream_body(edited)
    assert orjson.dumps(body) == encoder.encode("t", body)
    assert 3 == encoder.reused  # no start known there: encoded whole


_value = st.one_of(st.integers(-3, 3), st.floats(allow_nan=False), _text, st.none())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["append", "append", "copy", "back", "edit", "drop", "key", "round"]),
            st.lists(_message, min_size=0, max_size=3),
            _value,
        ),
        min_size=1,
        max_size=12,
    ),
    st.sampled_from(["first", "middle", "last", "alone"]),
)
def test_any_sequence_of_bodies_encodes_as_the_whole_encode(
    steps: list[tuple[str, list[dict[str, Any]]], Any], where: str
) -> None:
    """Whatever a session's views do (grow, rebuild equal messages, change or drop one,
    change one a few back, a tool round appended and gone again), and wherever ``messages`` sits among the keys,
    encode == orjson.dumps."""
    encoder = BodyEncoder(max_sessions=2, max_bytes=4096)
    history: list[dict[str, Any]] = []
    extra: dict[str, Any] = {"seed": 0}
    for op, new, value in steps:
        view = list(history)
        if op == "copy" and view:
            view[-1] = dict(view[-1])
        elif op == "edit" and view:
            view[0] = {**view[0], "content": value}
        elif op == "back" and view:  # a turn's block gone from its message a few back
            back = len(view) - min(len(view), 3)
            view[back] = {**view[back], "content": value}
        elif op == "drop" and view:
            del view[0]
        elif op == "key":
            extra = {"seed": value}
        elif op == "round":
            view.append({"role": "tool", "content": value})
        history = [*(view if op != "round" else history), *new]
        fields = {"model": "m", **extra}
        document = {
            "first": {"messages": history, **fields},
            "middle": {"model": "m", "messages": history, **extra},
            "last": {**fields, "messages": history},
            "alone": {"messages": history},
        }[where]
        assert orjson.dumps(document) == BodyEncoder().encode(None, document)
        assert orjson.dumps(document) == encoder.encode("s", document)
        if op == "round":
            assert orjson.dumps({"messages": view}) == encoder.encode("s", {"messages": view})


def test_the_encoder_is_bounded_by_sessions_and_bytes() -> None:
    history = conversation(4)
    encoder = BodyEncoder(max_sessions=2)
    for key in ("a", "b", "c"):  # "a" leaves: two sessions at most
        encoder.encode(key, upstream_body(history[:3]))
    encoder.encode("c", upstream_body(history[:4]))
    encoder.encode("a", upstream_body(history[:4]))
    assert 1 == encoder.reused
    size = len(orjson.dumps(upstream_body(history[:4])))
    encoder = BodyEncoder(max_bytes=2 * size)
    for key in ("a", "b", "c"):  # "a" leaves: two grown bodies' bytes at most
        encoder.encode(key, upstream_body(history[:3]))
    big = [{"role": "user", "content": "x" * 3 * size}]
    encoder.encode("big", upstream_body(big))  # over the bound alone: not kept, none leaves
    for key in ("big", "b", "c", "a"):
        encoder.encode(key, upstream_body([*big, *history] if key == "big" else history[:4]))
    assert 2 == encoder.reused  # b and c


def test_a_key_orjson_refuses_is_its_error() -> None:
    body = {"model": "m", "messages": [], 1: "x"}
    with pytest.raises(TypeError):
        orjson.dumps(body)
    with pytest.raises(TypeError):
        BodyEncoder().encode("s", body)
