"""``POST /v1/responses``: ``ragent-memory serve`` as a subprocess behind the real
``openai`` client's Responses API (what Codex CLI and the Agents SDK speak), a scripted
Responses upstream on 127.0.0.1."""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from fake_openai import Answer, FakeOpenAI
from serve_process import ProxyProcess, write_config
from wire_script import (
    call_item,
    reasoning_item,
    response,
    responses_events,
    responses_reply,
    text_item,
)

from ragent_memory.core.chars import chars
from ragent_memory.recall.refs import REF_PATTERN
from ragent_memory.serve.responses import ResponsesWire, to_engine

B = 20_000
KEY = "sk-resp-caller-secret-93ad1f"
INSTRUCTIONS = "You are Codex, a coding agent."
ARCHIVE = "".join(f"line {i}: the archived figure is {i * 7}.\n" for i in range(400))
COMPACTION = {
    "type": "compaction",
    "id": "cmp_1",
    "encrypted_content": "gAAAAB-compacted-history==",
}


def config_at(directory: Path, name: str, **serve: Any) -> Path:
    return write_config(directory, name, budget=B, **serve)


@pytest.fixture(scope="module")
def proxy(
    tmp_path_factory: pytest.TempPathFactory, upstream_server: FakeOpenAI
) -> Iterator[ProxyProcess]:
    workdir = tmp_path_factory.mktemp("responses")
    with ProxyProcess(config_at(workdir, "main"), upstream_server.base_url, cwd=workdir) as p:
        yield p


def client_for(proxy: ProxyProcess, session: str | None = "s") -> openai.OpenAI:
    headers = {"X-Session-Id": session} if session else {}
    return proxy.keep(
        openai.OpenAI(
            base_url=proxy.base_url, api_key=KEY, default_headers=headers, max_retries=0, timeout=60
        )
    )


def bodies(upstream: FakeOpenAI) -> list[dict[str, Any]]:
    return [r.body for r in upstream.requests if r.path == "/v1/responses"]


def tool_loop_input() -> list[dict[str, Any]]:
    """Codex-like input: a compaction item, messages, reasoning with encrypted content, a
    function call and its output, an assistant message with annotations."""
    return [
        COMPACTION,
        {"role": "developer", "content": "Sandbox: workspace-write."},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Fix the bug."}],
        },
        reasoning_item("rs_1", "gAAAAB-reasoning-one=="),
        call_item("call_1", "shell", '{"command": ["ls"]}'),
        {"type": "function_call_output", "call_id": "call_1", "output": "main.py\nutil.py"},
        reasoning_item("rs_2", "gAAAAB-reasoning-two=="),
        text_item("Found two files.", "msg_a"),
        {"role": "user", "content": "Now open main.py."},
    ]


# ---------------------------------------------------------------------- plain requests


def test_create_passes_items_byte_for_byte(proxy: ProxyProcess, upstream: FakeOpenAI) -> None:
    """instructions, every item (compaction and reasoning with encrypted content, the call
    and its output by call_id) and every field reach the upstream as sent; the SDK reads
    the reply."""
    upstream.enqueue(responses_reply([text_item("Opening it.")]))
    items = tool_loop_input()
    raw = client_for(proxy, "plain").responses.with_raw_response.create(
        model="gpt-fake",
        instructions=INSTRUCTIONS,
        input=copy.deepcopy(items),  # type: ignore[arg-type]
        tools=[
            {"type": "function", "name": "shell", "parameters": {"type": "object"}, "strict": False}
        ],
        store=False,
        include=["reasoning.encrypted_content"],
    )

    assert "Opening it." == raw.parse().output_text
    [request] = upstream.requests
    assert f"Bearer {KEY}" == request.headers["authorization"]
    sent = request.body
    assert (INSTRUCTIONS, items) == (sent["instructions"], sent["input"])
    assert (False, ["reasoning.encrypted_content"]) == (sent["store"], sent["include"])
    assert "0" == raw.headers["x-ragent-generation"]
    assert KEY not in proxy.log


def test_a_provider_chain_is_forwarded_untouched(proxy: ProxyProcess, upstream: FakeOpenAI) -> None:
    """previous_response_id: the engine cannot see the history, so the body goes upstream
    byte for byte and the reply says the engine did not manage it."""
    upstream.enqueue(responses_reply([text_item("Chained.")]))
    body = b'{"model": "m",  "previous_response_id": "resp_9", "input": "and then?"}'
    reply = httpx2.post(
        proxy.base_url + "/responses",
        content=body,
        headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
        timeout=60,
    )
    assert 200 == reply.status_code
    assert "false" == reply.headers["x-ragent-managed"]
    assert "x-ragent-generation" not in reply.headers
    [request] = upstream.requests
    assert json.loads(body) == request.body


def test_stream_relays_the_upstream_events(proxy: ProxyProcess, upstream: FakeOpenAI) -> None:
    """``responses.stream``: the text equals the upstream's, the events arrive byte for byte
    and the final response keeps the reasoning item and the app's call."""
    output = [
        reasoning_item("rs_s", "gAAAAB-stream=="),
        text_item("Streaming text, in several pieces."),
        call_item("call_s", "shell", '{"command": ["pwd"]}'),
    ]
    events = responses_events(output)
    upstream.enqueue(Answer.stream(events))
    with client_for(proxy, "stream").responses.stream(model="m", input="hi") as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert "Streaming text, in several pieces." == text
    assert output == [item.model_dump(exclude_none=True) for item in final.output]

    upstream.enqueue(Answer.stream(events))
    body = {"model": "m", "stream": True, "input": "hi"}
    with httpx2.stream(
        "POST",
        proxy.base_url + "/responses",
        json=body,
        headers={"authorization": f"Bearer {KEY}", "X-Session-Id": "stream-bytes"},
        timeout=60,
    ) as raw:
        assert b"".join(events) == b"".join(raw.iter_bytes())


def test_bad_input_is_a_one_line_400(proxy: ProxyProcess, upstream: FakeOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match=r"input\[0\]"):
        client_for(proxy).responses.create(model="m", input=[42])  # type: ignore[list-item]
    assert [] == upstream.requests


def test_sessions_without_headers() -> None:
    """X-Session-Id; else user / safety_identifier (session and user); else
    prompt_cache_key; else a session derived from instructions and the first item."""
    wire = ResponsesWire()
    body: dict[str, Any] = {"instructions": "i", "input": [{"role": "user", "content": "start"}]}
    assert ("h", None) == wire.ids({"x-session-id": "h"}, body)
    assert ("u", "u") == wire.ids({}, {**body, "user": "u"})
    assert ("si", "si") == wire.ids({}, {**body, "safety_identifier": "si"})
    assert ("conv-7", None) == wire.ids({}, {**body, "prompt_cache_key": "conv-7"})
    derived, no_user = wire.ids({}, body)
    assert no_user is None and derived.startswith("responses-")
    longer = {**body, "input": [*body["input"], text_item("ok"), {"role": "user", "content": "go"}]}
    assert derived == wire.ids({}, longer)[0]


# ---------------------------------------------------------------------- recall inside the proxy

RECALL_ID = "call_recall"


def recall_input() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Fetch the archive."},
        call_item("call_a", "fetch", "{}"),
        {"type": "function_call_output", "call_id": "call_a", "output": ARCHIVE},
        text_item("Fetched it."),
        {"role": "user", "content": "What does line 3 say exactly?"},
    ]


def recalling_model(body: Any) -> Answer:
    """Reasons, then calls recall_tool_result on the first ref it sees; answers once it
    has the text."""
    stream = body.get("stream") is True
    last = body["input"][-1]
    if last.get("type") == "function_call_output" and last["call_id"] == RECALL_ID:
        found = re.search(r"line 3: [^\n]*", str(last["output"]))
        output = [text_item(found.group(0) if found else "not found")]
    else:
        offered = [t.get("name") for t in body.get("tools") or ()]
        ref = REF_PATTERN.search(json.dumps(body["input"]))
        if "recall_tool_result" not in offered or ref is None:
            output = [text_item("no recall offered")]
        else:
            arguments = json.dumps({"ref": ref.group(0), "limit": 300})
            output = [
                reasoning_item("rs_r", "gAAAAB-recall=="),
                call_item(RECALL_ID, "recall_tool_result", arguments, "fc_r"),
            ]
    return Answer.stream(responses_events(output)) if stream else Answer(payload=response(output))


@pytest.mark.parametrize("stream", [False, True])
def test_recall_round_trip_happens_inside_the_proxy(
    proxy: ProxyProcess, upstream: FakeOpenAI, stream: bool
) -> None:
    """The proxy offers recall as a Responses function tool, answers the model's call with a
    function_call_output (the reasoning item kept before the call) and asks again: the app
    gets the answer, never the proxy's call."""
    upstream.default = recalling_model
    client = client_for(proxy, f"recall-{stream}")
    if stream:
        with client.responses.stream(model="m", input=recall_input()) as events:  # type: ignore[arg-type]
            final = events.get_final_response()
    else:
        final = client.responses.create(model="m", input=recall_input())  # type: ignore[arg-type]

    assert "line 3: the archived figure is 21." == final.output_text
    assert [] == [item for item in final.output if item.type == "function_call"]
    first, second = bodies(upstream)
    assert [("function", "recall_tool_result", False), ("function", "search_memory", False)] == [
        (t["type"], t["name"], t["strict"]) for t in first["tools"]
    ]
    assert ARCHIVE not in json.dumps(first["input"])
    reasoning, call, answer = second["input"][-3:]
    assert reasoning_item("rs_r", "gAAAAB-recall==") == reasoning
    assert (RECALL_ID, "recall_tool_result") == (call["call_id"], call["name"])
    assert ("function_call_output", RECALL_ID) == (answer["type"], answer["call_id"])
    assert answer["output"].startswith(ARCHIVE[:300])


def test_a_proxy_call_after_text_is_answered_and_the_stream_goes_on(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """A reply that speaks first streams through; the proxy's later call is cut, answered,
    and the next round's items follow in the same stream (opening events dropped, items and
    sequence numbers going on, the first round's response id kept): the SDK reads one
    response. The app's next request gets
    the model's call and its output spliced back in place of the reply it kept."""
    output = [
        text_item("Let me look."),
        call_item("call_late", "search_memory", '{"query": "archive", "limit": 999}'),
        text_item(" Done.", "msg_2"),
    ]
    upstream.enqueue(Answer.stream(responses_events(output)))
    second_round = responses_events([text_item("Found it.", "msg_3")])
    upstream.enqueue(Answer.stream([e.replace(b"resp_fake", b"resp_two") for e in second_round]))
    client = client_for(proxy, "late-call")
    with client.responses.stream(model="m", input=recall_input()) as stream:  # type: ignore[arg-type]
        numbers = [(e.type, e.sequence_number) for e in stream]
        final = stream.get_final_response()
    assert "Let me look. Done.Found it." == final.output_text
    assert "resp_fake" == final.id
    assert ["message", "message", "message"] == [item.type for item in final.output]
    assert list(range(len(numbers))) == [n for _, n in numbers]
    assert 1 == [kind for kind, _ in numbers].count("response.created")
    _, second = bodies(upstream)
    round_items = second["input"][-4:]  # the model's two texts, its call and the answer
    call, answer = round_items[-2:]
    assert ("call_late", "search_memory") == (call["call_id"], call["name"])
    assert ("function_call_output", "call_late") == (answer["type"], answer["call_id"])

    upstream.enqueue(responses_reply([text_item("Anything else?", "msg_4")]))
    kept = [item.model_dump(exclude_none=True) for item in final.output]
    later = [*recall_input(), *kept, {"role": "user", "content": "thanks"}]
    client.responses.create(model="m", input=later)  # type: ignore[arg-type]
    client.close()
    third = bodies(upstream)[2]["input"]
    assert round_items == third[-6:-2]  # the model's round, as it saw it
    assert "Found it." == third[-2]["content"][0]["text"]
    assert {"role": "user", "content": "thanks"} == third[-1]


# ---------------------------------------------------------------------- a long tool loop

REQUESTS = itertools.count()
RESULT = "".join(f"row {k}: value {k * 3} of the listing.\n" for k in range(60))  # ~2,000 chars


def looping_model(body: Any) -> Answer:
    """Each user message: reasoning + a function call; each output: reasoning + text (ids
    numbered by the upstream request)."""
    turn = next(REQUESTS)
    if body["input"][-1].get("type") == "function_call_output":
        output = [
            reasoning_item(f"rs_{turn}b", f"enc-{turn}-b"),
            text_item(f"Result {turn} read.", f"msg_{turn}"),
        ]
    else:
        output = [
            reasoning_item(f"rs_{turn}a", f"enc-{turn}-a"),
            call_item(f"call_{turn}", "shell", json.dumps({"n": turn}), f"fc_{turn}"),
        ]
    return Answer(payload=response(output))


def paired(items: list[dict[str, Any]]) -> bool:
    """Every function call answered by one output after it, and no other output."""
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    if sorted(calls) != sorted(outputs):
        return False
    position = {id(i): n for n, i in enumerate(items)}
    first = {i["call_id"]: position[id(i)] for i in items if i.get("type") == "function_call"}
    return all(
        position[id(i)] > first[i["call_id"]]
        for i in items
        if i.get("type") == "function_call_output"
    )


@pytest.mark.slow
def test_200_turn_tool_loop_stays_in_budget_paired_and_reasoning_kept(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """200 requests of a Codex-like stateless tool loop: every upstream request is within B
    in the engine's metric, every call answered after it, every reasoning item the one the
    model wrote (encrypted content byte for byte), and the session compacts."""
    upstream.default = looping_model
    client = client_for(proxy, "long-loop")
    items: list[dict[str, Any]] = []
    written: dict[str, dict[str, Any]] = {}
    for turn in range(200):
        if turn % 2 == 0:
            items.append({"role": "user", "content": f"Question {turn}: list the rows again."})
        else:
            items.append(
                {"type": "function_call_output", "call_id": items[-1]["call_id"], "output": RESULT}
            )
        raw = client.post(
            "/responses",
            body={"model": "m", "instructions": INSTRUCTIONS, "input": items, "store": False},
            cast_to=httpx2.Response,
        )
        output = raw.json()["output"]
        written.update({i["id"]: i for i in output if i["type"] == "reasoning"})
        items += output

    received = bodies(upstream)
    assert 200 == len(received)
    assert max(sum(chars(m) for m in to_engine(body)) for body in received) <= B
    assert all(paired(body["input"]) for body in received)
    shown = [i for body in received for i in body["input"] if i.get("type") == "reasoning"]
    assert shown and all(written[i["id"]] == i for i in shown)
    said = [  # what user and system messages say (the engine's summary included)
        json.dumps(i)
        for body in received
        for i in body["input"]
        if i.get("role") in ("user", "developer", "system")
    ]
    assert any("Summary of earlier turns" in text for text in said)
    assert not any("enc-" in text for text in said)  # reasoning is never summarised as text
    for body in received[1::2]:  # an output's request: the call's reasoning right before it
        reasoning, call, _ = body["input"][-3:]
        assert ("reasoning", "function_call") == (reasoning["type"], call["type"])
    assert int(raw.headers["x-ragent-generation"]) >= 1


def test_a_sessions_next_body_reuses_the_engine_messages_of_its_last() -> None:
    """``input`` is parsed by its tail too, and a run of assistant items or an item seen in
    the session's last body is not translated again: the engine gets the same objects."""
    from ragent_memory.serve.bodies import BodyCache
    from ragent_memory.serve.wire import Translations

    wire, bodies_seen = ResponsesWire(), BodyCache()
    items = tool_loop_input()
    body = {"model": "m", "instructions": INSTRUCTIONS, "input": items, "store": False}
    translations = Translations()
    first = wire.history(
        bodies_seen.parse("k", json.dumps(body).encode(), "input", wire.parse), translations
    )
    more = {**body, "input": [*items, text_item("Opened."), {"role": "user", "content": "go"}]}
    second = wire.history(
        bodies_seen.parse("k", json.dumps(more).encode(), "input", wire.parse), translations.next()
    )
    assert 1 == bodies_seen.tail_parses
    assert len(first) + 2 == len(second)
    assert all(a is b for a, b in zip(first, second, strict=False))
    assert second == to_engine(more)


def test_what_goes_upstream_is_always_paired() -> None:
    """An output whose call the view no longer shows goes as a user message; a call whose
    output it no longer shows gets an output saying so; the latest call is left alone."""
    from ragent_memory.serve.responses import NOT_IN_VIEW, from_engine

    call = {"id": "call_k", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
    view = [
        {"role": "tool", "tool_call_id": "call_gone", "content": "old rows"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "user", "content": "and now?"},
        {"role": "assistant", "content": None, "tool_calls": [{**call, "id": "call_last"}]},
    ]
    _, items = from_engine(view)
    assert {"role": "user", "content": "[output of call call_gone]\nold rows"} == items[0]
    assert ("function_call", "call_k") == (items[1]["type"], items[1]["call_id"])
    assert {"type": "function_call_output", "call_id": "call_k", "output": NOT_IN_VIEW} == items[2]
    assert ("function_call", "call_last") == (items[-1]["type"], items[-1]["call_id"])


def test_the_way_back_reuses_the_last_requests_items() -> None:
    """The view's messages the session's last request translated back (the same objects,
    or equal copies) give the very items they made then, a call in them answered by an
    output only the new messages hold; a message that changed is translated afresh; calls
    a run leaves unanswered get their outputs in call order. Always equal to a translation
    from nothing."""
    from ragent_memory.serve.responses import NOT_IN_VIEW, from_engine
    from ragent_memory.serve.wire import Translations

    def call(call_id: str) -> dict[str, Any]:
        function = {"name": "shell", "arguments": "{}"}
        return {"id": call_id, "type": "function", "function": function}

    view = [
        {"role": "system", "content": INSTRUCTIONS, "x_instructions": True},
        {"role": "user", "content": "[memory] uses vim"},
        {"role": "user", "content": "list it"},
        {"role": "assistant", "content": None, "tool_calls": [call("call_1")]},
    ]
    first = Translations()
    instructions, items = from_engine(view, first)
    grown = [
        view[0],
        dict(view[1]),
        *view[2:],
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
        {"role": "assistant", "content": None, "tool_calls": [call("call_2"), call("call_3")]},
        {"role": "user", "content": "never mind"},
    ]
    second = first.next()
    assert (instructions, from_engine(grown)[1]) == from_engine(grown, second)
    _, again = from_engine(grown, second.next())
    assert all(a is b for a, b in zip(items, again, strict=False))
    assert ("function_call_output", "call_1") == (again[3]["type"], again[3]["call_id"])
    owed = [(i["call_id"], i["output"]) for i in again if i.get("output") == NOT_IN_VIEW]
    assert [("call_2", NOT_IN_VIEW), ("call_3", NOT_IN_VIEW)] == owed
    assert paired(again)

    changed = [*grown[:4], {**grown[4], "content": "[trimmed]"}, *grown[5:]]
    _, third = from_engine(changed, second.next())
    assert third == from_engine(changed)[1]
    assert "[trimmed]" == third[3]["output"]
