"""The proxy's request bodies parsed by what is new (``ragent_memory.serve.bodies``): every
body parses to what ``orjson.loads`` gives, and only a session's appended messages are new."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest
import uvicorn
from fake_openai import Answer, FakeOpenAI, sse_events
from hypothesis import given, settings
from hypothesis import strategies as st
from sessions import tool_loop

from ragent_memory import MemoryEngine, Settings
from ragent_memory.recall.refs import REF_PATTERN
from ragent_memory.serve.app import create_app
from ragent_memory.serve.bodies import BodyCache
from ragent_memory.serve.http import Reject
from ragent_memory.serve.wire import Translations, dumped_object
from ragent_memory.settings import ServeSettings

TRICKY = st.text(alphabet='ab ]["},:\\\n\té😀你', max_size=12)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": TRICKY},
    optional={"name": TRICKY, "tool_calls": st.lists(st.fixed_dictionaries({"id": TRICKY}))},
)
FORMATS = st.fixed_dictionaries(
    {
        "ensure_ascii": st.booleans(),
        "separators": st.sampled_from([(",", ":"), (", ", ": "), (" ,", " :")]),
        "indent": st.sampled_from([None, 2]),
    }
)
# what a session's next body does to its messages: most often it appends
STEPS = st.one_of(
    st.tuples(st.just("append"), st.lists(message, min_size=1, max_size=3)),
    st.tuples(st.just("append"), st.lists(message, max_size=2)),
    st.tuples(st.sampled_from(["edit", "truncate", "swap", "drop"]), st.integers(0, 30)),
    st.tuples(st.just("stream"), st.booleans()),
    st.tuples(st.just("format"), FORMATS),
)


def moved(body: dict[str, Any], step: tuple[str, Any]) -> dict[str, Any]:
    """``body`` after one step (a new dict; the messages list a new list)."""
    kind, arg = step
    messages = list(body["messages"])
    if kind == "append":
        messages += arg
    elif kind == "stream":
        return {**body, "stream": arg}
    elif messages and kind == "edit":
        at = arg % len(messages)
        messages[at] = {**messages[at], "content": messages[at]["content"] + "!"}
    elif kind == "truncate":
        messages = messages[: arg % (len(messages) + 1)]
    elif len(messages) > 1 and kind == "swap":
        at = arg % (len(messages) - 1)
        messages[at], messages[at + 1] = messages[at + 1], messages[at]
    elif messages and kind == "drop":
        del messages[arg % len(messages)]
    return {**body, "messages": messages}


def encoded(body: dict[str, Any], form: dict[str, Any]) -> bytes:
    return json.dumps(body, **form).encode()


@settings(max_examples=300, deadline=None)
@given(
    st.booleans(),
    st.lists(message, max_size=4),
    FORMATS,
    st.lists(STEPS, min_size=1, max_size=12),
)
def test_every_body_parses_as_orjson_does(
    model_first: bool, start: list[dict[str, Any]], form: dict[str, Any], steps: list[Any]
) -> None:
    """Appended, edited, truncated, reordered messages, other keys, other whitespace,
    non-ASCII and escapes: each body is what a whole parse gives, in the same key order."""
    cache = BodyCache()
    head = {"model": "m"} if model_first else {}
    body = {**head, "messages": start, "tools": [{"type": "function", "x": [1, [2]]}]}
    for number, step in enumerate([("append", []), *steps]):
        if step[0] == "format":
            form = step[1]
        body = moved(body, step)
        raw = encoded(body, form)
        tails = cache.tail_parses
        got = cache.parse("s", raw)
        assert orjson.loads(raw) == got
        assert list(orjson.loads(raw)) == list(got)
        if number and step[0] == "append":  # an append is parsed by its tail, whatever came before
            assert tails + 1 == cache.tail_parses


@settings(max_examples=300, deadline=None)
@given(st.booleans(), st.lists(message, max_size=4), st.lists(STEPS, min_size=1, max_size=12))
def test_every_payload_is_the_json_orjson_gives(
    model_first: bool, start: list[dict[str, Any]], steps: list[Any]
) -> None:
    """A session's payload reuses the JSON of the messages its last one sent (the same
    objects, or equal ones) and is still, byte for byte, what ``orjson.dumps`` gives of the
    whole body, whatever the next body did to its messages."""
    head = {"model": "m"} if model_first else {}
    body = {**head, "messages": start, "tools": [{"type": "function", "x": [1, [2]]}]}
    translations = Translations()
    for step in [("append", []), *steps]:
        body = moved(body, step)
        translations = translations.next()
        sent = dumped_object(body, "messages", translations.dumped(body["messages"]))
        assert orjson.dumps(body) == sent


def test_appended_messages_are_the_only_new_objects() -> None:
    """An append is parsed by its tail: the earlier messages are the very objects handed out
    before (so the engine knows them by identity); the top-level dict and list are fresh."""
    cache = BodyCache()
    history = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a ]"}]
    first = cache.parse("s", encoded({"messages": history, "stream": True}, {}))
    history += [{"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    second = cache.parse("s", encoded({"messages": history, "stream": True}, {}))
    third = cache.parse("s", encoded({"messages": history, "stream": True}, {}))

    assert 2 == cache.tail_parses
    assert history == second["messages"] == third["messages"]
    assert all(a is b for a, b in zip(first["messages"], second["messages"], strict=False))
    assert all(a is b for a, b in zip(second["messages"], third["messages"], strict=True))
    assert second is not third and second["messages"] is not third["messages"]


def test_another_session_and_an_edit_are_parsed_whole() -> None:
    """The cache is per key, and a body that is not an append is parsed whole."""
    cache = BodyCache()
    history = [{"role": "user", "content": "a"}]
    cache.parse("s", encoded({"messages": history}, {}))
    longer = encoded({"messages": [*history, {"role": "user", "content": "b"}]}, {})
    cache.parse("t", longer)
    edited = encoded({"messages": [{"role": "user", "content": "A"}, history[0]]}, {})
    assert orjson.loads(edited) == cache.parse("s", edited)
    assert 0 == cache.tail_parses


@pytest.mark.parametrize(
    ("tail", "says"),
    [
        (b',{"role": "user"', "not JSON"),
        (b',{"role": "user"}, ', "not JSON"),
        (b' {"role": "user"}', "not JSON"),
        (b',{"role": "user"}]} {', "not JSON"),
    ],
)
def test_a_broken_tail_is_the_400_a_whole_parse_gives(tail: bytes, says: str) -> None:
    """A tail that is not a run of values fails as the whole body would."""
    cache = BodyCache()
    raw = b'{"messages": [{"role": "user", "content": "a"}], "stream": false}'
    cache.parse("s", raw)
    cache.parse("s", raw)  # proves where the messages end
    at = raw.index(b"]")
    with pytest.raises(Reject) as caught:
        cache.parse("s", raw[:at] + tail + raw[at:])
    assert 400 == caught.value.status
    assert says in caught.value.message


def test_the_split_is_proved_not_guessed() -> None:
    """A "]" inside a string that looks like the end of ``messages`` is never taken for it."""
    cache = BodyCache()
    fake = '"}], "model": "m"}'
    raw = encoded({"messages": [{"role": "user", "content": fake}], "model": "m"}, {})
    cache.parse("s", raw)
    at = raw.index(b"]")  # the one inside the string
    forged = raw[:at] + b'"}, {"role": "user", "content": "x' + raw[at:]
    assert orjson.loads(forged) == cache.parse("s", forged)


@pytest.mark.parametrize(
    "tail",
    [
        b', {"role": "user", "content": "x"}], "messages": [{"role": "user", "content": "y"}',
        b', {"role": "user", "content": "x"}], "m": [1',
    ],
)
def test_a_tail_that_closes_the_messages_is_parsed_whole(tail: bytes) -> None:
    """A tail that closes ``messages`` and opens another key (a duplicate ``messages`` even)
    is no run of values: the body is what ``orjson.loads`` makes of it."""
    cache = BodyCache()
    raw = b'{"messages": [{"role": "user", "content": "a"}], "model": "m"}'
    cache.parse("s", raw)
    cache.parse("s", raw)  # proves where the messages end
    at = raw.index(b"]")
    smuggled = raw[:at] + tail + raw[at:]
    assert orjson.loads(smuggled) == cache.parse("s", smuggled)


def test_bounded_by_sessions_and_bytes() -> None:
    """The least recently used session goes first past either bound; a body over the byte
    bound is not kept."""
    cache = BodyCache(max_sessions=2, max_bytes=200)
    small = [{"role": "user", "content": "a"}]
    for key in ("a", "b", "c"):  # "a" goes
        cache.parse(key, encoded({"messages": small}, {}))
    grown = encoded({"messages": [*small, *small]}, {})
    for key in ("b", "c", "a"):
        cache.parse(key, grown)
    assert 2 == cache.tail_parses
    big = encoded({"messages": [{"role": "user", "content": "x" * 300}]}, {})
    cache.parse("d", big)
    cache.parse("d", big)
    assert 2 == cache.tail_parses


# ---------------------------------------------------------------------- through the real app

ARCHIVE = "".join(f"line {i}: the archived figure is {i * 7}.\n" for i in range(400))


def recalling(body: Any) -> Answer:
    """Reads back the first ref it sees when offered the recall tool, else answers."""
    offered = [tool["function"]["name"] for tool in body.get("tools") or ()]
    ref = REF_PATTERN.search(json.dumps(body["messages"]))
    stream = body.get("stream") is True
    if body["messages"][-1]["role"] == "tool" or "recall_tool_result" not in offered or not ref:
        return Answer.stream(sse_events(["ok"])) if stream else Answer.reply("ok")
    arguments = json.dumps({"ref": ref.group(0), "limit": 200})
    if stream:
        return Answer.stream(sse_events(tool_calls=[("recall_tool_result", arguments)]))
    function = {"name": "recall_tool_result", "arguments": arguments}
    return Answer.reply(
        None, "tool_calls", tool_calls=[{"id": "r", "type": "function", "function": function}]
    )


@contextlib.contextmanager
def serving(settings: Settings) -> Iterator[tuple[str, BodyCache]]:
    """The real app under uvicorn in a thread: its base URL and the proxy's body cache."""
    app = create_app(settings, engine=MemoryEngine(settings))
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1", app.routes[0].endpoint.proxy.bodies
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


def test_nothing_mutates_the_messages_handed_out_again(tmp_path: Path) -> None:
    """A session's messages go through ``prepare``, recall rounds, compaction, streams and
    ``after_turn`` turn after turn, handed out again each time: at the end they still equal
    the bytes the app sent, and every append was parsed by its tail."""
    with FakeOpenAI(default=recalling) as upstream:
        serve = ServeSettings(upstream=upstream.base_url)
        engine = Settings(context_window_chars=8_000, store=str(tmp_path / "m.db"), serve=serve)
        headers = {"Authorization": "Bearer k", "X-Session-Id": "s"}
        history: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
        rounds = []
        with serving(engine) as (url, bodies), httpx2.Client(timeout=60) as client:
            for turn in range(30):
                history.append({"role": "user", "content": f'question {turn}: é \\ " ]'})
                if turn % 6 == 1:
                    history += tool_loop(f"call_{turn}", ARCHIVE)
                raw = json.dumps({"model": "m", "messages": history, "stream": turn >= 20})
                response = client.post(url + "/chat/completions", content=raw, headers=headers)
                assert 200 == response.status_code, response.text
                rounds.append(int(response.headers["x-ragent-tool-rounds"]))
                history.append({"role": "assistant", "content": f"answer {turn}"})
        assert max(rounds) >= 1  # the proxy answered recall calls itself
        assert 28 == bodies.tail_parses  # all but the first body and the switch to streams
        assert orjson.loads(raw) == bodies.parse(("Bearer k", "s"), raw.encode())
