"""``ragent-memory serve``: the real server (a subprocess on 127.0.0.1) in front of a scripted
OpenAI-compatible upstream, driven by the real ``openai`` client that changes only its
``base_url`` and default headers."""

from __future__ import annotations

import dataclasses
import json
import re
import sqlite3
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx2
import openai
import pytest
from fake_openai import Answer, FakeOpenAI, sse_events
from serve_process import ProxyProcess, write_config
from sessions import run_cli, tool_loop

from ragent_memory import MemoryEngine, Settings, StoreSettings
from ragent_memory.core.chars import chars
from ragent_memory.recall.refs import REF_PATTERN

B = 20_000
KEY = "sk-caller-secret-7f3a9c51d2"
SYSTEM = {"role": "system", "content": "You are a careful assistant."}


def config_at(directory: Path, name: str, **serve: Any) -> Path:
    return write_config(directory, name, budget=B, max_body_bytes=1_048_576, **serve)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve")


@pytest.fixture(scope="module")
def proxy(workdir: Path, upstream_server: FakeOpenAI) -> Iterator[ProxyProcess]:
    config = config_at(workdir, "main")
    with ProxyProcess(config, upstream_server.base_url, cwd=workdir) as process:
        yield process


def client_for(proxy: ProxyProcess, session: str | None, user: str | None = None) -> openai.OpenAI:
    headers = {"X-Session-Id": session} if session else {}
    if user:
        headers["X-User-Id"] = user
    return proxy.keep(
        openai.OpenAI(
            base_url=proxy.base_url, api_key=KEY, default_headers=headers, max_retries=0, timeout=60
        )
    )


def sent_messages(upstream: FakeOpenAI) -> list[list[dict[str, Any]]]:
    return [r.body["messages"] for r in upstream.requests if r.path == "/v1/chat/completions"]


# ---------------------------------------------------------------------- plain requests


def test_completion_goes_through_prepare_with_the_callers_key(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """The upstream gets the prepared messages and the caller's own key; the reply comes
    back byte for byte, with the TurnReport figures as X-Ragent-* headers."""
    reply = b'{"id": "x1", "object": "chat.completion", "created": 7, "model": "m",  "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi \\u00e9"}, "finish_reason": "stop"}]}'
    upstream.enqueue(Answer(raw=reply, headers={"Content-Type": "application/json"}))
    history = [SYSTEM, {"role": "user", "content": "hello there"}]

    raw = client_for(proxy, "plain").chat.completions.with_raw_response.create(
        model="m", messages=history
    )

    assert reply == raw.content
    assert "hi é" == raw.parse().choices[0].message.content
    [request] = upstream.requests
    assert f"Bearer {KEY}" == request.headers["authorization"]
    assert "x-session-id" not in request.headers
    assert history == request.body["messages"]
    assert str(chars(history[0]) + chars(history[1])) == raw.headers["x-ragent-chars-out"]
    assert "0" == raw.headers["x-ragent-generation"]
    assert "false" == raw.headers["x-ragent-compacted"]
    assert "0" == raw.headers["x-ragent-tool-rounds"]


def test_user_field_names_the_session(proxy: ProxyProcess, upstream: FakeOpenAI) -> None:
    """Without X-Session-Id the request's ``user`` field is the session (and the user)."""
    client = client_for(proxy, None)
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}], user="field-user"
    )
    assert 200 == raw.status_code
    assert "field-user" == upstream.requests[0].body["user"]


def test_no_session_is_a_one_line_400(proxy: ProxyProcess, upstream: FakeOpenAI) -> None:
    """No X-Session-Id and no ``user`` field: a 400 saying how to name the session."""
    with pytest.raises(openai.BadRequestError) as caught:
        client_for(proxy, None).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    assert "X-Session-Id" in caught.value.message
    assert 1 == len(caught.value.response.text.strip().splitlines())
    assert [] == upstream.requests


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b'{"model": "m", "messages": [', "malformed body: not JSON"),
        (b'["not", "an", "object"]', "malformed body: expected a JSON object"),
        (b'{"model": "m", "messages": "hi"}', "'messages' must be a list"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "a"}, {"role": "robot"}]}',
            "messages[1]",
        ),
    ],
)
def test_bad_bodies_are_one_line_400s(
    proxy: ProxyProcess, upstream: FakeOpenAI, body: bytes, fragment: str
) -> None:
    """A malformed body or invalid history is a 400 with one line naming the problem."""
    response = httpx2.post(
        proxy.base_url + "/chat/completions",
        content=body,
        headers={"X-Session-Id": "bad", "Content-Type": "application/json"},
    )
    assert 400 == response.status_code
    assert 1 == len(response.text.strip().splitlines())
    assert fragment in response.json()["error"]["message"]
    assert [] == upstream.requests


def test_body_over_the_limit_is_413(proxy: ProxyProcess, upstream: FakeOpenAI) -> None:
    """A body over serve.max_body_bytes is refused before it is parsed."""
    big = [{"role": "user", "content": "x" * 1_100_000}]
    with pytest.raises(openai.APIStatusError) as caught:
        client_for(proxy, "big").chat.completions.create(model="m", messages=big)
    assert 413 == caught.value.status_code
    assert "serve.max_body_bytes" in caught.value.message
    assert [] == upstream.requests


def test_a_chunked_body_over_the_limit_is_413(proxy: ProxyProcess, upstream: FakeOpenAI) -> None:
    """A body sent without Content-Length is read only up to serve.max_body_bytes, then
    refused with a 413 (the proxy never holds more than the bound)."""

    def pieces() -> Iterator[bytes]:
        yield b'{"model": "m", "messages": [{"role": "user", "content": "'
        yield from (b"x" * 65_536 for _ in range(32))  # 2 MB in all, the limit is 1 MB
        yield b'"}]}'

    response = httpx2.post(
        proxy.base_url + "/chat/completions",
        content=pieces(),
        headers={"X-Session-Id": "chunked"},
        timeout=30,
    )
    assert 413 == response.status_code
    assert "serve.max_body_bytes" in response.json()["error"]["message"]
    assert [] == upstream.requests


def test_upstream_errors_keep_their_status(proxy: ProxyProcess, upstream: FakeOpenAI) -> None:
    """An upstream 429 reaches the app as a 429 with its body and Retry-After."""
    upstream.status(429, headers={"Retry-After": "7"})
    with pytest.raises(openai.RateLimitError) as caught:
        client_for(proxy, "limited").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    assert "7" == caught.value.response.headers["retry-after"]
    assert "scripted 429" in caught.value.message


def test_models_and_healthz(proxy: ProxyProcess, upstream: FakeOpenAI) -> None:
    """GET /v1/models is passed through with the caller's key; /healthz answers ok."""
    models = client_for(proxy, "m").models.list()
    assert ["fake-model"] == [m.id for m in models.data]
    assert f"Bearer {KEY}" == upstream.requests[0].headers["authorization"]
    assert {"status": "ok"} == httpx2.get(proxy.root_url + "/healthz").json()


def test_other_methods_and_paths_are_405_and_404(proxy: ProxyProcess, upstream: FakeOpenAI) -> None:
    """Only POST takes the fast chat route; anything else gets the router's answers."""
    chat = proxy.base_url + "/chat/completions"
    assert 405 == httpx2.get(chat).status_code
    assert "POST" in httpx2.put(chat, content=b"{}").headers["allow"]
    assert 404 == httpx2.post(proxy.base_url + "/chat/completion", content=b"{}").status_code
    assert [] == upstream.requests


# ---------------------------------------------------------------------- streaming


def test_stream_arrives_incrementally_and_byte_identical(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """SSE goes through chunk by chunk: the app holds the first chunk while the upstream is
    still waiting to finish, and the bytes it gets are exactly the upstream's."""
    go_on, finished = threading.Event(), threading.Event()
    events = sse_events(["Hel", "lo", " world"], chunk_id="inc")
    upstream.enqueue(Answer.stream(events, hold=go_on, hold_after=2, finished=finished))
    client = client_for(proxy, "stream")
    history = [{"role": "user", "content": "say hello"}]

    with client.chat.completions.with_streaming_response.create(
        model="m", messages=history, stream=True
    ) as response:
        pieces = response.iter_bytes()
        first = next(pieces)
        assert not finished.is_set()  # the upstream is still holding the rest back
        go_on.set()
        rest = b"".join(pieces)

    assert b"".join(events) == first + rest
    assert "text/event-stream" in response.headers["content-type"]
    assert "0" == response.headers["x-ragent-generation"]


def test_stream_parses_in_the_openai_client(proxy: ProxyProcess, upstream: FakeOpenAI) -> None:
    """The openai client reads the relayed stream as it reads any."""
    upstream.enqueue(Answer.stream(sse_events(["Hel", "lo", " world"])))
    stream = client_for(proxy, "stream2").chat.completions.create(
        model="m", messages=[{"role": "user", "content": "say hello"}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert "Hello world" == text


# ---------------------------------------------------------------------- recall inside the proxy

ARCHIVE = "".join(f"line {i}: the archived figure is {i * 7}.\n" for i in range(400))
RECALL_ID = "call_recall"


def recall_history() -> list[dict[str, Any]]:
    return [
        SYSTEM,
        {"role": "user", "content": "Fetch the archive."},
        *tool_loop("call_1", ARCHIVE),
        {"role": "assistant", "content": "Fetched it."},
        {"role": "user", "content": "What does line 3 say exactly?"},
    ]


def recalling_model(body: Any) -> Answer:
    """Calls recall_tool_result on the first ref it sees; answers once it has the text."""
    messages = body["messages"]
    stream = body.get("stream") is True
    if messages[-1]["role"] == "tool" and messages[-1]["tool_call_id"].startswith(RECALL_ID):
        found = re.search(r"line 3: [^\n]*", messages[-1]["content"])
        text = found.group(0) if found else "not found"
        return Answer.stream(sse_events(["It says: ", text])) if stream else Answer.reply(text)
    offered = [t["function"]["name"] for t in body.get("tools") or ()]
    ref = REF_PATTERN.search(json.dumps(messages))
    if "recall_tool_result" not in offered or ref is None:
        return Answer.reply("no recall offered")
    arguments = json.dumps({"ref": ref.group(0), "limit": 300})
    if stream:
        return Answer.stream(
            sse_events(tool_calls=[("recall_tool_result", arguments)], chunk_id="recall")
        )
    call = {
        "id": RECALL_ID,
        "type": "function",
        "function": {"name": "recall_tool_result", "arguments": arguments},
    }
    return Answer.reply(None, "tool_calls", tool_calls=[call])


def test_recall_round_trip_happens_inside_the_proxy(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """The view shows the big result as a preview; the proxy offers the recall tool, answers
    the model's call itself and asks again: the app gets the answer, never the tool call."""
    upstream.default = recalling_model
    raw = client_for(proxy, "recall").chat.completions.with_raw_response.create(
        model="m", messages=recall_history()
    )
    message = raw.parse().choices[0].message

    assert "line 3: the archived figure is 21." == message.content
    assert message.tool_calls is None
    assert "1" == raw.headers["x-ragent-truncated"]
    assert "1" == raw.headers["x-ragent-tool-rounds"]
    first, second = (r.body for r in upstream.requests)
    assert ["recall_tool_result", "search_memory"] == [
        t["function"]["name"] for t in first["tools"]
    ]
    assert ARCHIVE not in json.dumps(first["messages"])
    answer = second["messages"][-1]
    assert ("tool", RECALL_ID) == (answer["role"], answer["tool_call_id"])
    assert answer["content"].startswith(ARCHIVE[:300])


def test_bad_recall_arguments_get_a_readable_answer(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """A proxy-tool call with arguments that are not a JSON object is answered with a line
    the model can read, and the model is asked again."""
    call = {
        "id": "call_bad",
        "type": "function",
        "function": {"name": "recall_tool_result", "arguments": "not json"},
    }
    upstream.enqueue(Answer.reply(None, "tool_calls", tool_calls=[call]))
    upstream.reply("done")
    reply = client_for(proxy, "bad-args").chat.completions.create(
        model="m", messages=recall_history()
    )
    assert "done" == reply.choices[0].message.content
    answer = upstream.requests[1].body["messages"][-1]
    expected = "[recall_tool_result: arguments must be a JSON object, got 'not json']"
    assert expected == answer["content"]


def test_streamed_recall_round_trip(proxy: ProxyProcess, upstream: FakeOpenAI) -> None:
    """Streaming too: the proxy reads the recall call, answers it and streams the next
    round; the app's stream holds text only."""
    upstream.default = recalling_model
    stream = client_for(proxy, "recall-stream").chat.completions.create(
        model="m", messages=recall_history(), stream=True
    )
    chunks = list(stream)

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "It says: line 3: the archived figure is 21." == text
    assert all(not c.choices or c.choices[0].delta.tool_calls is None for c in chunks)
    assert "1" == stream.response.headers["x-ragent-tool-rounds"]
    assert 2 == len(upstream.requests)


def test_a_proxy_call_after_text_is_answered_and_the_stream_goes_on(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """Once text has gone out, a later call of the proxy's tool in that streamed reply is
    cut out of the events, answered, and the next round streams on in the same reply: one
    finish reason (the last round's), one [DONE]."""
    arguments = '{"query": "archive"}'
    events = sse_events(["Let me check."], tool_calls=[("search_memory", arguments)])
    upstream.enqueue(Answer.stream(events))
    upstream.enqueue(Answer.stream(sse_events([" It is", " there."], chunk_id="two")))
    stream = client_for(proxy, "late-call").chat.completions.create(
        model="m", messages=recall_history(), stream=True
    )
    chunks = [c for c in stream if c.choices]

    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert "Let me check. It is there." == text
    assert all(c.choices[0].delta.tool_calls is None for c in chunks)
    assert ["stop"] == [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
    _, second = (r.body for r in upstream.requests)
    asked, answer = second["messages"][-2:]
    assert ("Let me check.", "search_memory") == (
        asked["content"],
        asked["tool_calls"][0]["function"]["name"],
    )
    assert ("tool", asked["tool_calls"][0]["id"]) == (answer["role"], answer["tool_call_id"])


def test_app_tools_and_choice_are_respected(proxy: ProxyProcess, upstream: FakeOpenAI) -> None:
    """With tool_choice "none" the proxy adds no tool. A proxy-tool call beside the app's own
    calls is answered and cut out, so the app only sees tools it declared and continues
    from its reply; its next request reaches the model with the proxy's call and answer
    spliced back in place: every call answered, in the order the model made them."""
    app_tool = {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
    }
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}},
        {
            "id": "c2",
            "type": "function",
            "function": {"name": "search_memory", "arguments": '{"query": "archive"}'},
        },
    ]
    upstream.enqueue(Answer.reply(None, "tool_calls", tool_calls=calls))
    client = client_for(proxy, "app-tools")
    message = (
        client.chat.completions.create(model="m", messages=recall_history(), tools=[app_tool])
        .choices[0]
        .message
    )
    assert ["lookup"] == [c.function.name for c in message.tool_calls or []]
    offered = [t["function"]["name"] for t in upstream.requests[0].body["tools"]]
    assert ["lookup", "recall_tool_result", "search_memory"] == offered
    assert 1 == len(upstream.requests)

    kept = message.model_dump(exclude_none=True)
    result = {"role": "tool", "tool_call_id": "c1", "content": "looked up"}
    upstream.reply("all done")
    client.chat.completions.create(
        model="m", messages=[*recall_history(), kept, result], tools=[app_tool]
    )
    asked, ours, theirs = upstream.requests[1].body["messages"][-3:]
    assert ["c1", "c2"] == [c["id"] for c in asked["tool_calls"]]
    assert ("tool", "c2") == (ours["role"], ours["tool_call_id"])
    assert result == theirs

    client.chat.completions.create(model="m", messages=recall_history(), tool_choice="none")
    assert "tools" not in upstream.requests[2].body


def test_several_choices_never_show_proxy_calls(proxy: ProxyProcess, upstream: FakeOpenAI) -> None:
    """With n > 1 the proxy runs no tool rounds, but still cuts its own calls from each choice."""
    recall = {
        "id": "c9",
        "type": "function",
        "function": {"name": "recall_tool_result", "arguments": '{"ref": "rm-x"}'},
    }
    choices = [
        {"index": 0, "message": {"role": "assistant", "content": "one"}, "finish_reason": "stop"},
        {
            "index": 1,
            "message": {"role": "assistant", "content": None, "tool_calls": [recall]},
            "finish_reason": "tool_calls",
        },
    ]
    upstream.enqueue(Answer(payload={"choices": choices}))
    reply = client_for(proxy, "n2").chat.completions.create(
        model="m", messages=recall_history(), n=2
    )
    assert ["one", ""] == [c.message.content for c in reply.choices]
    assert reply.choices[1].message.tool_calls is None
    assert "stop" == reply.choices[1].finish_reason
    assert 1 == len(upstream.requests)


# ---------------------------------------------------------------------- long sessions


def chat_reply(turn: int) -> str:
    return f"Answer {turn}: " + " ".join(f"point {turn}.{k} holds." for k in range(22))


@pytest.mark.slow
def test_300_turn_session_stays_in_budget_and_matches_prepare(
    proxy: ProxyProcess, upstream: FakeOpenAI, tmp_path: Path
) -> None:
    """Every upstream request of a 300-turn session is what ``prepare`` makes of the app's
    history (checked against an engine replaying it), stays within B, and the session
    compacts, audited in the proxy's store (which `ragent-memory audit` reads as any other)."""
    turn_of: list[int] = []
    upstream.default = lambda body: chat_reply(len(turn_of))
    client = client_for(proxy, "long")
    history: list[dict[str, Any]] = [SYSTEM]
    sent: list[list[dict[str, Any]]] = []
    compacted = 0
    for turn in range(300):
        history.append(
            {"role": "user", "content": f"Question {turn}: " + "tell me more, " * 14 + "please."}
        )
        sent.append(list(history))
        turn_of.append(turn)
        # The client's own POST: `chat.completions.create` walks every message through its
        # typed transform (~1 ms a message here), minutes over a 600-message history.
        raw = client.post(
            "/chat/completions", body={"model": "m", "messages": history}, cast_to=httpx2.Response
        )
        compacted += raw.headers["x-ragent-compacted"] == "true"
        history.append(raw.json()["choices"][0]["message"])

    received = sent_messages(upstream)
    assert 300 == len(received)
    assert max(sum(chars(m) for m in messages) for messages in received) <= B
    assert compacted >= 5
    assert int(raw.headers["x-ragent-generation"]) >= 5

    replay = Settings(context_window_chars=B, store=StoreSettings(path=str(tmp_path / "r.db")))
    with MemoryEngine(replay) as engine:
        for messages, upstream_saw in zip(sent, received, strict=True):
            prepared = engine.prepare(messages, session_id="long")
            assert unref(prepared.messages) == unref(upstream_saw)

    db = sqlite3.connect(proxy_store(proxy))
    applied = db.execute(
        "SELECT count(*) FROM compactions WHERE session_id = 'long' AND status = 'applied'"
    ).fetchone()[0]
    db.close()
    assert applied >= 5
    audit = run_cli("audit", "--db", proxy_store(proxy), "--session", "long", "--json")
    assert applied == sum(row["status"] == "applied" for row in json.loads(audit.stdout))


def unref(messages: list[dict[str, Any]]) -> str:
    """Messages as JSON with recall refs blanked (refs are unguessable per store)."""
    return REF_PATTERN.sub("rm-…", json.dumps(messages, sort_keys=True))


def proxy_store(proxy: ProxyProcess) -> str:
    config = json.loads(proxy.config.read_text())
    return str(config["store"]["path"])


# ---------------------------------------------------------------------- users and secrets

FACTS = {
    "alice": ["My name is Alice.", "I live in Lisbon.", "I prefer green tea."],
    "bob": ["My name is Bob.", "I live in Oslo.", "I prefer black coffee."],
}


def talk(client: openai.OpenAI, lines: list[str]) -> None:
    history: list[dict[str, Any]] = [SYSTEM]
    for line in lines:
        history.append({"role": "user", "content": line})
        reply = client.chat.completions.create(model="m", messages=history)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})


def test_two_users_facts_stay_apart(workdir: Path, upstream: FakeOpenAI) -> None:
    """Facts learned from each user's session reach that user's later sessions only (after a
    graceful restart, which also proves the proxy flushes its background work)."""
    upstream.default = lambda body: "Noted."
    config = config_at(workdir, "users")
    with ProxyProcess(config, upstream.base_url, cwd=workdir) as first:
        for user, lines in FACTS.items():
            talk(client_for(first, f"{user}-1", user), lines)
        first.stop()
        assert "Application shutdown complete" in first.log
    listed = run_cli("memory", "list", "--user", "alice", "--db", str(workdir / "users.db"))
    assert "Lisbon" in listed.stdout and "Oslo" not in listed.stdout

    upstream.reset()
    with ProxyProcess(config, upstream.base_url, cwd=workdir) as second:
        for user in FACTS:
            client_for(second, f"{user}-2", user).chat.completions.create(
                model="m", messages=[SYSTEM, {"role": "user", "content": "Who am I?"}]
            )
    seen = {
        user: json.dumps(r.body["messages"])
        for user, r in zip(FACTS, upstream.requests, strict=True)
    }
    assert "Alice" in seen["alice"] and "Lisbon" in seen["alice"]
    assert "Bob" in seen["bob"] and "Oslo" in seen["bob"]
    assert "Bob" not in seen["alice"] and "Oslo" not in seen["alice"]
    assert "Alice" not in seen["bob"] and "Lisbon" not in seen["bob"]


def searching_model(body: Any) -> Answer:
    """Calls search_memory once when offered; then repeats what the search found."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        found = re.search(r"locker code is \d+", last["content"])
        return Answer.reply(found.group(0) if found else "nothing found")
    offered = [t["function"]["name"] for t in body.get("tools") or ()]
    if "search_memory" not in offered:
        return Answer.reply("no search offered")
    call = {
        "id": "call_search",
        "type": "function",
        "function": {"name": "search_memory", "arguments": '{"query": "locker code"}'},
    }
    return Answer.reply(None, "tool_calls", tool_calls=[call])


def test_search_round_trip_reaches_the_users_other_session(
    workdir: Path, upstream: FakeOpenAI
) -> None:
    """The proxy offers search_memory to a known user and answers the model's search with
    excerpts of that user's earlier session; the app sees only the final answer."""
    upstream.default = lambda body: "Noted."
    config = config_at(workdir, "search")
    with ProxyProcess(config, upstream.base_url, cwd=workdir) as first:
        talk(client_for(first, "carol-1", "carol"), ["My locker code is 4417 at the gym."])
        first.stop()
    upstream.reset()
    upstream.default = searching_model
    with ProxyProcess(config, upstream.base_url, cwd=workdir) as second:
        raw = client_for(second, "carol-2", "carol").chat.completions.with_raw_response.create(
            model="m", messages=[SYSTEM, {"role": "user", "content": "What was it again?"}]
        )
    message = raw.parse().choices[0].message
    assert "locker code is 4417" == message.content
    assert message.tool_calls is None
    assert "1" == raw.headers["x-ragent-tool-rounds"]
    answer = upstream.requests[1].body["messages"][-1]
    assert ("tool", "call_search") == (answer["role"], answer["tool_call_id"])


def test_an_app_tool_loop_keeps_the_turns_recall_block(workdir: Path, upstream: FakeOpenAI) -> None:
    """Through the proxy, the app's own tool loop: the upstream gets the turn's question with
    the same recall block (what the user said in an earlier session) on the loop's call as on
    the first, byte for byte, so the answer is written with it."""
    upstream.default = lambda body: "Noted."
    config = config_at(workdir, "loop")
    app_tool = {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
    }
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    with ProxyProcess(config, upstream.base_url, cwd=workdir) as process:
        talk(client_for(process, "erin-1", "erin"), ["My locker code is 4417 at the gym."])
        upstream.reset()
        upstream.enqueue(Answer.reply(None, "tool_calls", tool_calls=[call]))
        upstream.enqueue(Answer.reply("It is 4417."))
        client = client_for(process, "erin-2", "erin")
        history: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "My locker code?"}]
        first = client.chat.completions.create(model="m", messages=history, tools=[app_tool])
        assert ["lookup"] == [c.function.name for c in first.choices[0].message.tool_calls or []]
        history += tool_loop("c1", "Gym hours: 7 to 22.", name="lookup")
        second = client.chat.completions.create(model="m", messages=history, tools=[app_tool])
    assert "It is 4417." == second.choices[0].message.content
    asked, looped = sent_messages(upstream)
    question = asked[-1]
    assert "user" == question["role"] and "locker code is 4417" in json.dumps(question)
    assert json.dumps(question) == json.dumps(looped[len(asked) - 1])
    assert looped[len(asked) :] == history[2:]


def test_key_is_never_stored_or_logged(
    proxy: ProxyProcess, upstream: FakeOpenAI, workdir: Path
) -> None:
    """After every kind of request above (run first in this module), neither the verbose log
    nor any file of the proxy's store holds the caller's key."""
    upstream.default = recalling_model
    client_for(proxy, "secret", "someone").chat.completions.create(
        model="m", messages=recall_history()
    )
    assert f"Bearer {KEY}" == upstream.requests[0].headers["authorization"]
    assert proxy.lines, "the proxy logged nothing at -v"
    assert KEY not in proxy.log
    store_files = [p for p in workdir.iterdir() if p.name.startswith(("main.db", "users.db"))]
    assert store_files
    for path in store_files:
        assert KEY.encode() not in path.read_bytes()


# ---------------------------------------------------------------------- bounds


@pytest.fixture(scope="module")
def tight_proxy(workdir: Path, upstream_server: FakeOpenAI) -> Iterator[ProxyProcess]:
    config = config_at(workdir, "tight", max_concurrency=1, timeout_s=0.5)
    with ProxyProcess(config, upstream_server.base_url, cwd=workdir) as process:
        yield process


def test_concurrent_requests_are_bounded(tight_proxy: ProxyProcess, upstream: FakeOpenAI) -> None:
    """With serve.max_concurrency: 1, a second request while a stream is open gets a 503."""
    go_on = threading.Event()
    upstream.enqueue(Answer.stream(sse_events(["a", "b"]), hold=go_on, hold_after=2))
    client = client_for(tight_proxy, "busy")
    history = [{"role": "user", "content": "hi"}]
    with client.chat.completions.with_streaming_response.create(
        model="m", messages=history, stream=True
    ) as response:
        pieces = response.iter_bytes()
        next(pieces)
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(model="m", messages=history)
        go_on.set()
        b"".join(pieces)
    assert 503 == caught.value.status_code
    assert "serve.max_concurrency" in caught.value.message
    client.chat.completions.create(model="m", messages=history)  # free again


def test_upstream_timeout_is_504(tight_proxy: ProxyProcess, upstream: FakeOpenAI) -> None:
    """An upstream slower than serve.timeout_s gets a 504 naming the timeout."""
    upstream.stall(10)  # cut short when the fake closes
    with pytest.raises(openai.APIStatusError) as caught:
        client_for(tight_proxy, "slow").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    assert 504 == caught.value.status_code
    assert "timed out" in caught.value.message


def test_an_engine_that_never_waits_prepares_on_the_loop(
    workdir: Path, upstream: FakeOpenAI
) -> None:
    """With compaction_timeout_s: 0 prepare runs on the event loop: a long session stays
    within B, bad input is still a 400 naming the index, and an open stream does not hold
    up other requests."""
    config = config_at(workdir, "nowait", engine={"compaction_timeout_s": 0})
    with ProxyProcess(config, upstream.base_url, cwd=workdir) as process:
        client = client_for(process, "nowait")
        history: list[dict[str, Any]] = [SYSTEM]
        for turn in range(40):
            history.append({"role": "user", "content": f"Question {turn}: " + "more, " * 30})
            upstream.enqueue(Answer.reply(chat_reply(turn)))
            raw = client.post(  # not create(): its typed transform is slow on long histories
                "/chat/completions",
                body={"model": "m", "messages": history},
                cast_to=httpx2.Response,
            )
            history.append(raw.json()["choices"][0]["message"])
        sizes = [sum(chars(m) for m in sent) for sent in sent_messages(upstream)]
        assert B < sum(chars(m) for m in history)
        assert max(sizes) <= B

        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="m", messages=[*history, {"role": "robot"}])
        assert f"messages[{len(history)}]" in caught.value.message

        go_on = threading.Event()
        upstream.enqueue(Answer.stream(sse_events(["a", "b"]), hold=go_on, hold_after=2))
        with client_for(process, "open").chat.completions.with_streaming_response.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        ) as response:
            pieces = response.iter_bytes()
            next(pieces)
            upstream.enqueue(Answer.reply("meanwhile"))
            other = client_for(process, "other").chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
            go_on.set()
            b"".join(pieces)
        assert "meanwhile" == other.choices[0].message.content


class _KeepAliveUpstream(BaseHTTPRequestHandler):
    """An HTTP/1.1 upstream that keeps connections open and notes the client port of each
    request (the scripted fake answers HTTP/1.0, one connection a request)."""

    protocol_version = "HTTP/1.1"
    ports: ClassVar[list[int]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.ports.append(self.client_address[1])
        choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}}
        body = json.dumps({"choices": [{**choice, "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_upstream_connections_are_reused(workdir: Path) -> None:
    """Requests go to the upstream over one kept-alive connection, not one each: a new
    connection per request cost more than everything else the proxy does."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _KeepAliveUpstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        with ProxyProcess(config_at(workdir, "reuse"), url, cwd=workdir) as process:
            client = client_for(process, "reuse")
            history = [{"role": "user", "content": "hi"}]
            for _ in range(4):
                reply = client.chat.completions.create(model="m", messages=history)
                history += [{"role": "assistant", "content": "ok"}, *history[:1]]
            assert "ok" == reply.choices[0].message.content
    finally:
        server.shutdown()
        server.server_close()
    assert 4 == len(_KeepAliveUpstream.ports)
    assert 1 == len(set(_KeepAliveUpstream.ports))


def test_upstream_cookies_reach_their_caller_only(workdir: Path, upstream: FakeOpenAI) -> None:
    """A Set-Cookie from the upstream is relayed to the caller it answers; the proxy keeps no
    cookie jar, so the next caller's request does not carry it (the default jar takes
    cookies from a named host such as localhost)."""
    port = urllib.parse.urlsplit(upstream.base_url).port
    config = config_at(workdir, "cookies")
    with ProxyProcess(config, f"http://localhost:{port}/v1", cwd=workdir) as process:
        upstream.enqueue(
            dataclasses.replace(Answer.reply("one"), headers={"Set-Cookie": "sid=one; Path=/"})
        )
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        url = process.base_url + "/chat/completions"
        first = httpx2.post(url, json=body, headers={"X-Session-Id": "first"})
        assert "sid=one; Path=/" == first.headers["set-cookie"]
        httpx2.post(url, json=body, headers={"X-Session-Id": "second"})
    assert 2 == len(upstream.requests)
    assert "cookie" not in upstream.requests[1].headers


def test_unreachable_upstream_is_502(workdir: Path, closed_url: str) -> None:
    """No upstream listening: a 502 the app can read."""
    config = config_at(workdir, "dead")
    with (
        ProxyProcess(config, closed_url, cwd=workdir) as dead,
        pytest.raises(openai.APIStatusError) as caught,
    ):
        client_for(dead, "dead").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    assert 502 == caught.value.status_code
    assert "upstream unreachable" in caught.value.message


def test_serve_without_upstream_is_a_one_line_error(workdir: Path) -> None:
    """`serve` with no upstream anywhere exits 2 with one line."""
    config = workdir / "none.yaml"
    config.write_text("context_window_chars: 20000\n")
    result = run_cli("serve", "--config", str(config), cwd=workdir)
    assert 2 == result.returncode
    assert "serve.upstream" in result.stderr
    assert 1 == len(result.stderr.strip().splitlines())


@pytest.mark.parametrize(
    ("section", "key_path"),
    [
        ({"upstream": "ftp://x/v1"}, "serve.upstream"),
        ({"port": 70_000}, "serve.port"),
        ({"max_body_bytes": 10}, "serve.max_body_bytes"),
        ({"timeout_s": 0}, "serve.timeout_s"),
        ({"max_concurrency": 0}, "serve.max_concurrency"),
        ({"max_tool_rounds": -1}, "serve.max_tool_rounds"),
        ({"nope": 1}, "serve.nope"),
    ],
)
def test_serve_section_errors_name_the_key(section: dict[str, Any], key_path: str) -> None:
    """A bad serve: section fails with a ConfigError naming the key path."""
    from ragent_memory import ConfigError
    from ragent_memory.settings import settings_from_dict

    with pytest.raises(ConfigError) as caught:
        settings_from_dict({"serve": section})
    assert key_path == caught.value.key_path


def test_a_prepare_that_may_wait_holds_up_no_other_session(
    workdir: Path, upstream: FakeOpenAI
) -> None:
    """A known session's turn that cannot reach the compaction trigger is prepared on the
    event loop; one that can (here: waiting on a held summary) goes to a worker thread, so
    another session's request is served meanwhile, and so is the waiting session's next
    request (its lock is held by the worker)."""
    asked, gate = threading.Event(), threading.Event()

    def held_summary(body: Any) -> str:
        asked.set()
        gate.wait(30)
        return "## Goal\n- help\n## Facts\n- questions asked\n## Next\n- answer"

    turns = [
        message
        for turn in range(30)
        for message in (
            {"role": "user", "content": f"Question {turn}: " + "more, " * 50},
            {"role": "assistant", "content": f"Answer {turn}: " + "sure, " * 50},
        )
    ]
    big = [SYSTEM, *turns, {"role": "user", "content": "So, what now?"}]
    short = [SYSTEM, {"role": "user", "content": "hi"}]
    with FakeOpenAI(default=held_summary) as model:
        engine = {"llm": {"base_url": model.base_url, "model": "s"}, "compaction_timeout_s": 30}
        config = config_at(workdir, "heldsummary", engine=engine)
        with (
            ProxyProcess(config, upstream.base_url, cwd=workdir) as process,
            client_for(process, "quick") as quick,
            client_for(process, "slow") as slow,
        ):
            first = quick.chat.completions.create(model="m", messages=short)
            slow.chat.completions.create(model="m", messages=big[:3])
            waiting = threading.Thread(
                target=slow.chat.completions.create, kwargs={"model": "m", "messages": big}
            )
            waiting.start()
            try:
                assert asked.wait(30)  # the slow session's prepare waits on the summary
                more = [*short, first.choices[0].message.model_dump(), short[1]]
                quick.with_options(timeout=10).chat.completions.create(model="m", messages=more)
                again = threading.Thread(
                    target=slow.chat.completions.create, kwargs={"model": "m", "messages": big}
                )
                again.start()  # the same session again: a worker thread, not the loop
                quick.with_options(timeout=10).chat.completions.create(model="m", messages=more)
                assert waiting.is_alive() and not gate.is_set()
            finally:
                gate.set()
                waiting.join(60)
            again.join(60)
        log = re.sub(r"\x1b\[[0-9;]*m", "", process.log)  # without the colours
        on_loop = re.findall(r"prepare_on_loop=(\w+)", log)
    # first sight of each session: a worker; quick's next turns: the loop; slow's: a worker
    assert ["False", "False", "True", "True", "False", "False"] == on_loop


def test_prepare_in_a_worker_thread_serves_the_turn(workdir: Path, upstream: FakeOpenAI) -> None:
    """With a model summarizer configured, prepare runs in a worker thread: the turn still
    goes through it (its figures come back) and the reply is the upstream's."""
    model = {"llm": {"base_url": upstream.base_url, "model": "summarizer"}}
    config = config_at(workdir, "worker", engine=model)
    history = [SYSTEM, {"role": "user", "content": "hello"}]
    with (
        ProxyProcess(config, upstream.base_url, cwd=workdir) as process,
        client_for(process, "worker") as client,
    ):
        upstream.enqueue(Answer.reply("from the worker"))
        raw = client.chat.completions.with_raw_response.create(model="m", messages=history)
    assert "from the worker" == raw.parse().choices[0].message.content
    assert str(chars(history[0]) + chars(history[1])) == raw.headers["x-ragent-chars-out"]
    assert [history] == sent_messages(upstream)
