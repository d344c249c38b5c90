"""``POST /v1/messages``: ``ragent-memory serve`` as a subprocess behind the real
``anthropic`` client (what Claude Code speaks), a scripted Messages upstream on 127.0.0.1."""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest
from fake_openai import Answer, FakeOpenAI
from serve_process import ProxyProcess, write_config
from wire_script import (
    anthropic_events,
    anthropic_reply,
    message,
    thinking,
    tool_use,
)

from ragent_memory.core.chars import chars
from ragent_memory.recall.refs import REF_PATTERN
from ragent_memory.serve.anthropic import (
    MAX_BREAKPOINTS,
    AnthropicWire,
    limit_breakpoints,
    to_engine,
)

B = 20_000
KEY = "sk-ant-caller-secret-51c2e9"
SYSTEM = [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}]
ARCHIVE = "".join(f"line {i}: the archived figure is {i * 7}.\n" for i in range(400))
EPHEMERAL = {"type": "ephemeral"}


def config_at(directory: Path, name: str, **serve: Any) -> Path:
    return write_config(directory, name, budget=B, **serve)


@pytest.fixture(scope="module")
def proxy(
    tmp_path_factory: pytest.TempPathFactory, upstream_server: FakeOpenAI
) -> Iterator[ProxyProcess]:
    workdir = tmp_path_factory.mktemp("messages")
    with ProxyProcess(config_at(workdir, "main"), upstream_server.base_url, cwd=workdir) as p:
        yield p


ClientFor = Callable[..., anthropic.Anthropic]


@pytest.fixture
def client_for() -> Iterator[ClientFor]:
    """SDK clients for a proxy (``client_for(proxy, session, **headers)``), each closed after
    the test (an open one leaves its socket to the garbage collector)."""
    with contextlib.ExitStack() as clients:

        def make(
            proxy: ProxyProcess, session: str | None = "s", **headers: str
        ) -> anthropic.Anthropic:
            if session:
                headers["X-Session-Id"] = session
            client = anthropic.Anthropic(
                base_url=proxy.root_url,
                api_key=KEY,
                default_headers=headers,
                max_retries=0,
                timeout=60,
            )
            return clients.enter_context(client)

        yield make


def bodies(upstream: FakeOpenAI) -> list[dict[str, Any]]:
    return [r.body for r in upstream.requests if r.path == "/v1/messages"]


def engine_chars(body: dict[str, Any]) -> int:
    """An upstream request's size in the engine's own metric (docs/design.md §2)."""
    return sum(chars(m) for m in to_engine(body))


def breakpoints(body: dict[str, Any]) -> int:
    return json.dumps(body).count('"cache_control"')


# ---------------------------------------------------------------------- plain requests


def test_create_passes_system_blocks_headers_and_fields(
    client_for: ClientFor, proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """A short conversation goes upstream as sent: system blocks (cache_control kept),
    metadata and every field; x-api-key, anthropic-version and anthropic-beta reach the
    upstream; the key is never in the proxy's log; the SDK reads the reply."""
    upstream.enqueue(anthropic_reply([{"type": "text", "text": "Hi there."}]))
    history = [{"role": "user", "content": "hello"}]
    client = client_for(proxy, "plain", **{"anthropic-beta": "context-1m-2025-08-07"})
    raw = client.messages.with_raw_response.create(
        model="claude-fake",
        max_tokens=64,
        system=SYSTEM,
        messages=history,
        metadata={"user_id": "u-1"},
        stop_sequences=["END"],
    )

    assert "Hi there." == raw.parse().content[0].text
    [request] = upstream.requests
    # this SDK sends the key as a bearer token; Claude Code as x-api-key (see the stream test)
    assert f"Bearer {KEY}" == request.headers["authorization"]
    assert "anthropic-version" in request.headers
    assert "context-1m-2025-08-07" == request.headers["anthropic-beta"]
    sent = request.body
    assert (SYSTEM, history, 64, ["END"]) == (
        sent["system"],
        sent["messages"],
        sent["max_tokens"],
        sent["stop_sequences"],
    )
    assert {"user_id": "u-1"} == sent["metadata"]
    assert "0" == raw.headers["x-ragent-generation"]
    assert KEY not in proxy.log


def test_tool_loop_with_thinking_goes_upstream_byte_for_byte(
    client_for: ClientFor, proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """tool_use / tool_result (block content, is_error), thinking and redacted_thinking
    with their signatures, images and cache_control: the upstream gets the turns as sent."""
    upstream.enqueue(anthropic_reply([{"type": "text", "text": "Done."}]))
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    history = [
        {"role": "user", "content": [{"type": "text", "text": "Look at this."}, image]},
        {
            "role": "assistant",
            "content": [
                thinking("I should list the files first.", "EqQBCkYIARgCIkD+sig/==" * 3),
                {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a" * 2},
                {"type": "text", "text": "Listing."},
                tool_use("toolu_1", "ls", {"path": ".", "depth": 2}),
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "is_error": True,
                    "content": [{"type": "text", "text": "permission denied"}],
                    "cache_control": EPHEMERAL,
                },
                {"type": "text", "text": "Try again."},
            ],
        },
    ]
    reply = client_for(proxy, "loop").messages.create(
        model="claude-fake",
        max_tokens=64,
        messages=copy.deepcopy(history),
        tools=[{"name": "ls", "description": "list", "input_schema": {"type": "object"}}],
    )

    assert "Done." == reply.content[0].text
    [request] = upstream.requests
    assert history == request.body["messages"]
    assert "system" not in request.body


def test_stream_relays_the_upstream_events(
    client_for: ClientFor, proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """``messages.stream``: the events arrive as the upstream wrote them (byte for byte),
    the text equals the upstream's and the final message keeps the thinking signature and
    the app's tool call."""
    blocks = [
        thinking("Plan the answer.", "sig-stream-1=="),
        {"type": "text", "text": "Hello from the stream, in pieces."},
        tool_use("toolu_s", "ls", {"path": "src"}),
    ]
    events = anthropic_events(blocks)
    upstream.enqueue(Answer.stream(events))
    with client_for(proxy, "stream").messages.stream(
        model="claude-fake", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()

    assert "Hello from the stream, in pieces." == text
    assert blocks == [block.model_dump(exclude_none=True) for block in final.content]
    assert "tool_use" == final.stop_reason

    upstream.enqueue(Answer.stream(events))
    body = {
        "model": "m",
        "max_tokens": 8,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    with httpx2.stream(
        "POST",
        proxy.root_url + "/v1/messages",
        json=body,
        headers={"x-api-key": KEY, "X-Session-Id": "stream-bytes"},
        timeout=60,
    ) as raw:
        assert b"".join(events) == b"".join(raw.iter_bytes())
    assert KEY == upstream.requests[-1].headers["x-api-key"]


def test_the_query_string_reaches_the_upstream(
    client_for: ClientFor, proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """Claude Code posts to /v1/messages?beta=true: so does the proxy."""
    upstream.enqueue(anthropic_reply([{"type": "text", "text": "beta"}]))
    reply = client_for(proxy, "beta").post(
        "/v1/messages?beta=true",
        body={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        cast_to=httpx2.Response,
    )
    assert "beta" == reply.json()["content"][0]["text"]
    assert ["/v1/messages?beta=true"] == [r.path for r in upstream.requests]


def test_count_tokens_passes_through(
    client_for: ClientFor, proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    upstream.enqueue(Answer(payload={"input_tokens": 42}))
    counted = client_for(proxy, None).messages.count_tokens(
        model="claude-fake", messages=[{"role": "user", "content": "count me"}]
    )
    assert 42 == counted.input_tokens
    [request] = upstream.requests
    assert "/v1/messages/count_tokens" == request.path
    assert [{"role": "user", "content": "count me"}] == request.body["messages"]


def test_errors_are_anthropic_shaped(
    client_for: ClientFor, proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """A turn no provider could read is a one-line 400 naming it that the anthropic client
    reads; an upstream error keeps its status and body."""
    with pytest.raises(anthropic.BadRequestError, match=r"messages\[0\]\.role: 'critic'"):
        client_for(proxy).messages.create(
            model="m",
            max_tokens=8,
            messages=[{"role": "critic", "content": "x"}],  # type: ignore[list-item, typeddict-item]
        )
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "busy upstream"}}
    upstream.enqueue(Answer(status=529, payload=error))
    with pytest.raises(anthropic.APIStatusError, match="busy upstream") as caught:
        client_for(proxy).messages.create(
            model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    assert 529 == caught.value.status_code


def test_sessions_without_headers() -> None:
    """X-Session-Id first; else metadata.user_id (session and user); else a session derived
    from system and the first turn: the same for every turn of one conversation."""
    wire = AnthropicWire()
    first = {"role": "user", "content": "start"}
    body = {"system": "s", "messages": [first]}
    assert ("h", "u") == wire.ids({"x-session-id": "h", "x-user-id": "u"}, body)
    assert ("meta", "meta") == wire.ids({}, {**body, "metadata": {"user_id": "meta"}})
    derived, no_user = wire.ids({}, body)
    assert no_user is None
    later = {"system": "s", "messages": [first, {"role": "assistant", "content": "ok"}, first]}
    assert (derived, None) == wire.ids({}, later)
    assert derived.startswith("messages-")
    assert derived != wire.ids({}, {"system": "other", "messages": [first]})[0]


def test_breakpoints_past_four_lose_the_earliest_in_messages() -> None:
    """Never more than 4 cache_control marks: tools and system keep theirs."""
    turns = [
        {"role": "user", "content": [{"type": "text", "text": f"t{i}", "cache_control": EPHEMERAL}]}
        for i in range(4)
    ]
    body = {
        "tools": [{"name": "ls", "input_schema": {}, "cache_control": EPHEMERAL}],
        "system": SYSTEM,
        "messages": turns,
    }
    sent = copy.deepcopy(turns)
    mine = list(turns)
    limit_breakpoints(body)
    assert 4 == breakpoints(body)
    kept = ["cache_control" in t["content"][0] for t in body["messages"]]
    assert [False, False, True, True] == kept
    assert sent == mine  # the turns it changed were replaced, not edited (they may be shared)


# ---------------------------------------------------------------------- recall inside the proxy

RECALL_ID = "toolu_recall"
SIGNATURE = "sig-of-the-recall-round=="


def recall_history() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Fetch the archive."},
        {"role": "assistant", "content": [tool_use("toolu_a", "fetch", {})]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": ARCHIVE}],
        },
        {"role": "assistant", "content": "Fetched it."},
        {"role": "user", "content": "What does line 3 say exactly?"},
    ]


def recalling_model(body: Any) -> Answer:
    """Calls recall_tool_result (after thinking) on the first ref it sees; answers once it
    has the text."""
    stream = body.get("stream") is True
    last = body["messages"][-1]["content"]
    answered = [b for b in last if isinstance(b, dict) and b.get("tool_use_id") == RECALL_ID]
    if answered:
        found = re.search(r"line 3: [^\n]*", str(answered[0]["content"]))
        blocks = [{"type": "text", "text": found.group(0) if found else "not found"}]
    else:
        offered = [t["name"] for t in body.get("tools") or ()]
        ref = REF_PATTERN.search(json.dumps(body["messages"]))
        if "recall_tool_result" not in offered or ref is None:
            blocks = [{"type": "text", "text": "no recall offered"}]
        else:
            arguments = {"ref": ref.group(0), "limit": 300}
            blocks = [
                thinking("I need the raw text.", SIGNATURE),
                tool_use(RECALL_ID, "recall_tool_result", arguments),
            ]
    return Answer.stream(anthropic_events(blocks)) if stream else Answer(payload=message(blocks))


@pytest.mark.parametrize("stream", [False, True])
def test_recall_round_trip_happens_inside_the_proxy(
    client_for: ClientFor, proxy: ProxyProcess, upstream: FakeOpenAI, stream: bool
) -> None:
    """The big result is shown as a preview; the proxy offers recall in Anthropic's tool
    shape, answers the model's tool_use itself (its thinking kept on that assistant turn)
    and asks again: the app gets the answer, never the proxy's call."""
    upstream.default = recalling_model
    client = client_for(proxy, f"recall-{stream}")
    history = recall_history()
    if stream:
        with client.messages.stream(model="m", max_tokens=64, messages=history) as events:
            text = "".join(events.text_stream)
            reply = events.get_final_message()
    else:
        reply = client.messages.create(model="m", max_tokens=64, messages=history)
        text = reply.content[0].text

    assert "line 3: the archived figure is 21." == text
    assert [] == [b for b in reply.content if b.type == "tool_use"]
    assert "end_turn" == reply.stop_reason
    first, second = bodies(upstream)
    assert ["recall_tool_result", "search_memory"] == [t["name"] for t in first["tools"]]
    assert ARCHIVE not in json.dumps(first["messages"])
    asked, answer = second["messages"][-2:]
    assert thinking("I need the raw text.", SIGNATURE) == asked["content"][0]
    assert RECALL_ID == asked["content"][1]["id"]
    [result] = answer["content"]
    assert ("tool_result", RECALL_ID) == (result["type"], result["tool_use_id"])
    assert result["content"].startswith(ARCHIVE[:300])


# ---------------------------------------------------------------------- a long tool loop

REQUESTS = itertools.count()
RESULT = "".join(f"row {k}: value {k * 3} of the listing.\n" for k in range(60))  # ~2,000 chars


def looping_model(body: Any) -> Answer:
    """Each user question: thinking + a tool call; each tool result: thinking + text (ids
    and signatures numbered by the upstream request)."""
    turn = next(REQUESTS)
    last = body["messages"][-1]["content"]
    if isinstance(last, list) and any(b.get("type") == "tool_result" for b in last):
        blocks = [
            thinking(f"Summarise result {turn}.", f"sig-{turn}-b=="),
            {"type": "text", "text": f"Result {turn} read."},
        ]
    else:
        blocks = [
            thinking(f"Look it up {turn}.", f"sig-{turn}-a=="),
            tool_use(f"toolu_{turn}", "ls", {"n": turn}),
        ]
    return Answer(payload=message(blocks))


def paired(turns: list[dict[str, Any]]) -> bool:
    """Every tool_use answered by a tool_result in the next turn, and no other result."""
    for index, turn in enumerate(turns):
        content = turn["content"] if isinstance(turn["content"], list) else []
        results = {b["tool_use_id"] for b in content if b.get("type") == "tool_result"}
        before = turns[index - 1]["content"] if index else []
        asked = (
            {b["id"] for b in before if isinstance(b, dict) and b.get("type") == "tool_use"}
            if isinstance(before, list)
            else set()
        )
        if turn["role"] == "user" and results != asked:
            return False
    return True


@pytest.mark.slow
def test_200_turn_tool_loop_stays_in_budget_paired_and_signed(
    client_for: ClientFor, proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """200 requests of a Claude-Code-like tool loop (system and the latest turns marked for
    the cache): every upstream request is within B in the engine's metric, every tool_use is
    answered in the next turn, every thinking block is the one the model wrote (signature
    byte for byte), at most 4 cache_control marks, and the session compacts."""
    upstream.default = looping_model
    client = client_for(proxy, "long-loop")
    history: list[dict[str, Any]] = []
    signed: dict[str, dict[str, Any]] = {}
    for turn in range(200):
        if turn % 2 == 0:
            history.append(
                {
                    "role": "user",
                    "content": [{"type": "text", "text": f"Question {turn}: list the rows again."}],
                }
            )
        else:
            call = history[-1]["content"][-1]
            result = {"type": "tool_result", "tool_use_id": call["id"], "content": RESULT}
            history.append({"role": "user", "content": [result]})
        sent = copy.deepcopy(history)
        for user_turn in [t for t in sent if t["role"] == "user"][-2:]:
            user_turn["content"][-1]["cache_control"] = EPHEMERAL
        raw = client.post(
            "/v1/messages",
            body={"model": "m", "max_tokens": 64, "system": SYSTEM, "messages": sent},
            cast_to=httpx2.Response,
        )
        reply = raw.json()
        signed.update({b["signature"]: b for b in reply["content"] if b["type"] == "thinking"})
        history.append({"role": "assistant", "content": reply["content"]})

    received = bodies(upstream)
    assert 200 == len(received)
    assert max(engine_chars(body) for body in received) <= B
    assert all(paired(body["messages"]) for body in received)
    assert all(breakpoints(body) <= 4 for body in received)
    shown = [
        block
        for body in received
        for turn in body["messages"]
        if isinstance(turn["content"], list)
        for block in turn["content"]
        if block.get("type") == "thinking"
    ]
    assert shown and all(signed[block["signature"]] == block for block in shown)
    said = [  # what user turns say (the engine's summary and memory included)
        json.dumps(turn["content"])
        for body in received
        for turn in body["messages"]
        if turn["role"] == "user"
    ]
    assert any("Summary of earlier turns" in text for text in said)
    assert not any("Look it up" in text or "Summarise result" in text for text in said)
    for body in received[1::2]:  # a tool result's request: its call's turn keeps its thinking
        asked = body["messages"][-2]
        assert "thinking" == asked["content"][0]["type"]
    assert int(raw.headers["x-ragent-generation"]) >= 1


def test_a_proxy_call_after_text_is_answered_and_the_stream_goes_on(
    client_for: ClientFor, proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """A reply that speaks first streams through; the proxy's later tool_use block is cut,
    answered, and the next round's blocks follow in the same message (its message_start
    dropped, block indices going on): the SDK reads one message with the last round's stop
    reason. The app's next request gets the model's call and its result spliced back in
    place of the reply it kept, the same bytes on every later request."""
    call = tool_use("toolu_late", "search_memory", {"query": "archive", "limit": 500})
    blocks = [{"type": "text", "text": "Let me look."}, call, {"type": "text", "text": " Done."}]
    upstream.enqueue(Answer.stream(anthropic_events(blocks)))
    upstream.enqueue(Answer.stream(anthropic_events([{"type": "text", "text": "Found it."}])))
    client = client_for(proxy, "late-call")
    with client.messages.stream(model="m", max_tokens=64, messages=recall_history()) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert "Let me look. Done.Found it." == text
    assert ["text", "text", "text"] == [block.type for block in final.content]
    assert "end_turn" == final.stop_reason
    first, second = bodies(upstream)
    assert ["recall_tool_result", "search_memory"] == [t["name"] for t in first["tools"]]
    asked, answered = second["messages"][-2:]
    assert call == asked["content"][-1]
    assert ("tool_result", "toolu_late") == tuple(
        answered["content"][0][k] for k in ("type", "tool_use_id")
    )

    kept = {
        "role": "assistant",
        "content": [b.model_dump(exclude_none=True) for b in final.content],
    }
    later = [*recall_history(), kept, {"role": "user", "content": "thanks"}]
    for _ in range(2):
        upstream.enqueue(anthropic_reply([{"type": "text", "text": "You are welcome."}]))
        client.messages.create(model="m", max_tokens=64, messages=later)
        later = [
            *later,
            {"role": "assistant", "content": "You are welcome."},
            {"role": "user", "content": "bye"},
        ]
    third, fourth = bodies(upstream)[2:]
    assert [asked, answered] == third["messages"][-4:-2]  # the model's round, as it saw it
    assert [{"type": "text", "text": "Found it."}] == third["messages"][-2]["content"]
    spliced = json.dumps(third["messages"][:-1])
    assert spliced == json.dumps(fourth["messages"][: len(third["messages"]) - 1])


def test_upstreams_send_each_provider_to_its_own_url(
    client_for: ClientFor, tmp_path: Path, upstream: FakeOpenAI
) -> None:
    """serve.upstreams: /v1/messages goes to the anthropic URL, chat completions and
    responses to serve.upstream; one port serves all three formats."""
    with FakeOpenAI() as claude:
        config = config_at(tmp_path, "two", upstreams={"anthropic": claude.base_url})
        claude.enqueue(anthropic_reply([{"type": "text", "text": "from claude"}]))
        upstream.enqueue(Answer(payload={"output": [], "status": "completed"}))
        with ProxyProcess(config, upstream.base_url, cwd=tmp_path) as two:
            said = client_for(two, "two").messages.create(
                model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
            httpx2.post(
                two.base_url + "/responses",
                json={"model": "m", "input": "hi"},
                headers={"authorization": f"Bearer {KEY}", "X-Session-Id": "two"},
                timeout=60,
            )
            chat = httpx2.post(
                two.base_url + "/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                headers={"authorization": f"Bearer {KEY}", "X-Session-Id": "two"},
                timeout=60,
            )
        assert "from claude" == said.content[0].text
        assert ["/v1/messages"] == [r.path for r in claude.requests]
        assert ["/v1/responses", "/v1/chat/completions"] == [r.path for r in upstream.requests]
        assert 200 == chat.status_code


def test_a_sessions_next_body_reuses_the_engine_messages_of_its_last() -> None:
    """The body cache hands out the last body's turns again and the translation reuses what
    it made of them: the engine gets the very message objects it saw before (the identity
    its prefix checks rely on), only the new turns translated afresh."""
    from ragent_memory.serve.bodies import BodyCache
    from ragent_memory.serve.wire import Translations

    wire, bodies_seen = AnthropicWire(), BodyCache()
    turns = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": [tool_use("toolu_m", "ls", {})]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_m", "content": "x"}],
        },
    ]
    first_body = {"model": "m", "system": "s", "messages": turns}
    translations = Translations()
    first = wire.history(bodies_seen.parse("k", json.dumps(first_body).encode()), translations)
    more = {
        **first_body,
        "messages": [
            *turns,
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "two"},
        ],
    }
    second = wire.history(bodies_seen.parse("k", json.dumps(more).encode()), translations.next())
    assert 1 == bodies_seen.tail_parses
    assert len(first) + 2 == len(second)
    assert all(a is b for a, b in zip(first, second, strict=False))
    assert second == to_engine(more)


def test_what_goes_upstream_is_always_paired() -> None:
    """A view that starts with a tool result whose call it no longer shows sends that result
    as text; a call whose result it no longer shows gets a result saying so."""
    from ragent_memory.serve.anthropic import NOT_IN_VIEW, from_engine

    call = {"id": "toolu_k", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    view = [
        {"role": "system", "content": "s"},
        {"role": "tool", "tool_call_id": "toolu_gone", "content": "old rows"},
        {"role": "user", "content": "next?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "user", "content": "and now?"},
    ]
    system, turns, _ = from_engine(view)
    assert "s" == system
    assert [
        {"type": "text", "text": "[tool result toolu_gone]\nold rows"},
        {"type": "text", "text": "next?"},
    ] == turns[0]["content"]
    assert [tool_use("toolu_k", "ls", {})] == turns[1]["content"]
    missing = {"type": "tool_result", "tool_use_id": "toolu_k", "content": NOT_IN_VIEW}
    assert [missing, {"type": "text", "text": "and now?"}] == turns[2]["content"]
    assert paired(turns)


def test_the_way_back_reuses_the_last_requests_turns() -> None:
    """The view's messages the session's last request translated back (the same objects,
    or equal copies such as the memory block the engine makes anew each turn) give the
    very turns they made then, the pairing going on from where it stopped; a message that
    changed (a trimmed result) is translated afresh. Always equal to a translation from
    nothing."""
    from ragent_memory.serve.anthropic import from_engine
    from ragent_memory.serve.wire import Translations

    def call(call_id: str) -> dict[str, Any]:
        return {"id": call_id, "type": "function", "function": {"name": "ls", "arguments": "{}"}}

    view = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "[memory] likes tea"},
        {"role": "user", "content": "list it"},
        {"role": "assistant", "content": None, "tool_calls": [call("toolu_1")]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "a.py b.py"},
        {"role": "assistant", "content": "Two files. Listing again.", "tool_calls": [call("t2")]},
    ]
    first = Translations()
    _, turns, _ = from_engine(view, first)
    grown = [
        view[0],
        dict(view[1]),  # made anew, equal
        *view[2:],
        {"role": "tool", "tool_call_id": "t2", "content": "a.py b.py"},
        {"role": "user", "content": "thanks"},
    ]
    second = first.next()
    _, again, _ = from_engine(grown, second)
    assert again == from_engine(grown)[1]
    assert all(a is b for a, b in zip(turns, again[: len(turns)], strict=True))
    assert {"type": "tool_result", "tool_use_id": "t2", "content": "a.py b.py"} in again[-1][
        "content"
    ]
    assert paired(again)

    trimmed = [*grown[:4], {**grown[4], "content": "[trimmed]"}, *grown[5:]]
    _, third, _ = from_engine(trimmed, second.next())
    assert third == from_engine(trimmed)[1]
    assert third[1] is again[1]  # the assistant turn before the changed result
    assert "[trimmed]" == third[2]["content"][0]["content"]


def test_the_payload_keeps_four_breakpoints_when_the_turns_are_reused() -> None:
    """The marks of the view's turns are counted as they are made (a nested tool_result
    part too), so a payload whose turns come from the last request still holds at most 4:
    the earliest in messages lose theirs, the app's system keeps its own."""
    from ragent_memory.serve.wire import Translations

    def marked(text: str) -> dict[str, Any]:
        return {"type": "text", "text": text, "cache_control": EPHEMERAL}

    call = {"id": "toolu_c", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    view = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [marked("one")]},
        {"role": "assistant", "content": [marked("two")], "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "toolu_c", "content": [marked("three")]},
        {"role": "assistant", "content": [marked("four")]},
        {"role": "user", "content": [marked("five")]},
    ]
    body = {"model": "m", "max_tokens": 9, "system": SYSTEM, "messages": []}
    wire, translations = AnthropicWire(), Translations()
    for _ in range(2):
        sent = json.loads(wire.payload(body, view, [], translations))
        translations = translations.next()
        assert MAX_BREAKPOINTS == breakpoints(sent)
        assert "cache_control" in sent["system"][0]
        assert "cache_control" in sent["messages"][-1]["content"][0]
    assert "cache_control" in view[1]["content"][0]  # the view's own blocks are left alone
