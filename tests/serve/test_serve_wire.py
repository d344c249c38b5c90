"""Wire conformance with what real clients send: ``ragent-memory serve`` as a subprocess, the
bodies Claude Code 2.1 and Codex CLI 0.171 sent (``tests/fixtures``, captured from the real
CLIs, long strings cut) and bodies built from the APIs' references, posted through the real
SDKs or raw httpx (where the exact bytes matter) to a scripted upstream on 127.0.0.1; and the
proxy's own tools answered wherever the model calls them, inside B."""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from fake_openai import Answer, FakeOpenAI, sse_events
from serve_process import ProxyProcess, write_config
from wire_script import (
    anthropic_events,
    anthropic_reply,
    call_item,
    message,
    response,
    responses_events,
    responses_reply,
    text_item,
    tool_use,
)

from ragent_memory.core.chars import chars
from ragent_memory.recall.refs import REF_PATTERN
from ragent_memory.serve import anthropic as messages_wire
from ragent_memory.serve import responses as responses_wire
from ragent_memory.serve.anthropic import AnthropicWire, client_ids
from ragent_memory.serve.own_tools import NO_ROOM, fitted, limited
from ragent_memory.serve.responses import ResponsesWire
from ragent_memory.serve.splice import Splices

B = 40_000  # room for a turn of every block type (each non-text block counts 2,000)
KEY = "sk-wire-caller-secret-77e1a0"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
OWN_TOOLS = ["recall_tool_result", "search_memory"]
HUGE = "".join(f"row {i}: the stored figure is {i * 11}.\n" for i in range(2_500))  # ~80,000


@pytest.fixture(scope="module")
def proxy(
    tmp_path_factory: pytest.TempPathFactory, upstream_server: FakeOpenAI
) -> Iterator[ProxyProcess]:
    workdir = tmp_path_factory.mktemp("wire")
    config = write_config(workdir, "wire", budget=B)
    with ProxyProcess(config, upstream_server.base_url, cwd=workdir) as running:
        yield running


def fixture(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return loaded


def post(proxy: ProxyProcess, path: str, body: dict[str, Any], **headers: str) -> httpx2.Response:
    """``body`` posted as exact JSON bytes, with the caller's key."""
    sent = {"x-api-key": KEY, "authorization": f"Bearer {KEY}", **headers}
    return httpx2.post(proxy.root_url + path, content=json.dumps(body), headers=sent, timeout=60)


def logged(proxy: ProxyProcess, text: str, within_s: float = 30.0) -> bool:
    """Whether the proxy's log (colours aside) says ``text`` within ``within_s`` (its stderr
    is read by a thread: a line may come a moment after the response)."""
    deadline = time.monotonic() + within_s
    while text not in re.sub(r"\x1b\[[0-9;]*m", "", proxy.log):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def sent_to(upstream: FakeOpenAI, route: str) -> list[dict[str, Any]]:
    return [r.body for r in upstream.requests if r.path.split("?")[0] == route]


def names(tools: list[dict[str, Any]]) -> list[str]:
    return [t.get("name") or t["function"]["name"] for t in tools]


# ---------------------------------------------------------------------- what clients send


def test_claude_codes_own_request_goes_upstream_as_sent(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """Claude Code's default-model request (a system turn at messages[1], system-reminder
    blocks, a tool loop, cache_control, thinking and context_management settings, beta
    headers) reaches the upstream byte for byte, the proxy's two tools after its own."""
    captured = fixture("claude_code_request.json")
    body = captured["body"]
    assert "system" == body["messages"][1]["role"]
    blocks = [{"type": "text", "text": "Done."}]
    upstream.enqueue(Answer.stream(anthropic_events(blocks)))
    reply = post(proxy, captured["path"], body, **captured["headers"])

    assert 200 == reply.status_code, reply.text
    [request] = upstream.requests
    assert captured["path"] == request.path
    assert captured["headers"]["anthropic-beta"] == request.headers["anthropic-beta"]
    sent = request.body
    assert body["messages"] == sent["messages"]
    assert (body["system"], body["metadata"]) == (sent["system"], sent["metadata"])
    assert [*names(body["tools"]), *OWN_TOOLS] == names(sent["tools"])
    assert body["tools"] == sent["tools"][: len(body["tools"])]
    assert {k: v for k, v in body.items() if k not in ("messages", "tools")} == {
        k: v for k, v in sent.items() if k not in ("messages", "tools")
    }


def test_claude_codes_metadata_names_the_session_and_the_user() -> None:
    """metadata.user_id as Claude Code sends it (a JSON string, or the older
    user_…_account_…_session_… form): its session_id is the session, its account_uuid
    (else device_id) the user; any other string names both; the headers win; without a
    session there, Claude Code's X-Claude-Code-Session-Id header names it."""
    wire = AnthropicWire()
    captured = fixture("claude_code_request.json")["body"]
    named = json.loads(captured["metadata"]["user_id"])
    assert (named["session_id"], named["device_id"]) == wire.ids({}, captured)
    both = {"device_id": "dev-1", "account_uuid": "acct-9", "session_id": "sess-3"}
    assert ("sess-3", "acct-9") == client_ids(json.dumps(both))
    legacy = "user_5033e42b_account_4d2c-acct_session_e967049a-fd74"
    assert ("e967049a-fd74", "4d2c-acct") == client_ids(legacy)
    assert ("e967049a-fd74", "5033e42b") == client_ids(
        "user_5033e42b_account__session_e967049a-fd74"
    )
    assert ("u-1", "u-1") == client_ids("u-1")
    assert ("{not json", "{not json") == client_ids("{not json")
    assert (None, None) == client_ids("")
    headed = wire.ids({"x-session-id": "h", "x-user-id": "hu"}, captured)
    assert ("h", "hu") == headed
    no_session = {**captured, "metadata": {"user_id": json.dumps({"device_id": "dev-2"})}}
    session, user = wire.ids({}, no_session)
    assert session.startswith("messages-") and "dev-2" == user
    assert ("cc-7", "dev-2") == wire.ids({"x-claude-code-session-id": "cc-7"}, no_session)


def test_codex_requests_go_upstream_as_sent(proxy: ProxyProcess, upstream: FakeOpenAI) -> None:
    """Codex's requests (developer messages, AGENTS.md and environment user messages, a
    function call loop; with its default model an ``additional_tools`` item at input[0])
    reach the upstream byte for byte, each item in its place, the proxy's tools after the
    app's; the session is its prompt_cache_key (the proxy's log says so)."""
    for name in ("codex_request.json", "codex_default_model_request.json"):
        upstream.reset()
        captured = fixture(name)
        body = captured["body"]
        upstream.enqueue(Answer.stream(responses_events([text_item("Done.")])))
        reply = post(proxy, captured["path"], body, **captured["headers"])

        assert 200 == reply.status_code, reply.text
        [sent] = sent_to(upstream, "/v1/responses")
        assert body["input"] == sent["input"]
        assert body.get("instructions") == sent.get("instructions")
        assert [*names(body.get("tools", [])), *OWN_TOOLS] == names(sent["tools"])
        assert logged(proxy, f"session_id={body['prompt_cache_key']} ")
    assert "additional_tools" == body["input"][0]["type"]


def test_codex_ids_come_from_its_metadata() -> None:
    """prompt_cache_key is the session when no header names one (before ``user``); the user
    is X-User-Id, else user / safety_identifier, else Codex's installation id."""
    wire = ResponsesWire()
    body = fixture("codex_request.json")["body"]
    installation = body["client_metadata"]["x-codex-installation-id"]
    assert (body["prompt_cache_key"], installation) == wire.ids({}, body)
    assert ("h", "hu") == wire.ids({"x-session-id": "h", "x-user-id": "hu"}, body)
    assert (body["prompt_cache_key"], "u") == wire.ids({}, {**body, "user": "u"})
    bare = {"input": "hi", "user": "u"}
    assert ("u", "u") == wire.ids({}, bare)


# ---------------------------------------------------------------------- every turn and block

SYSTEM_TURN = {"role": "system", "content": "Environment: linux, bash."}
DEVELOPER_TURN = {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]}
SIGNED = {"type": "thinking", "thinking": "Plan.", "signature": "c2lnbmF0dXJl=="}


def every_block_history() -> list[dict[str, Any]]:
    """Turns holding every current Messages block type, a made-up one, and system and
    developer turns in the middle and at the end."""
    pdf = {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQ="}
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Read these."},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                {
                    "type": "document",
                    "source": pdf,
                    "title": "spec",
                    "citations": {"enabled": True},
                },
                {
                    "type": "search_result",
                    "source": "https://example.com/doc",
                    "title": "Doc",
                    "content": [{"type": "text", "text": "found text"}],
                },
                {"type": "container_upload", "file_id": "file_011"},
            ],
        },
        SYSTEM_TURN,
        {
            "role": "assistant",
            "content": [
                SIGNED,
                {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix=="},
                {
                    "type": "server_tool_use",
                    "id": "srvtoolu_1",
                    "name": "web_search",
                    "input": {"query": "weather"},
                },
                {
                    "type": "web_search_tool_result",
                    "tool_use_id": "srvtoolu_1",
                    "content": [{"type": "web_search_result", "url": "https://x", "title": "X"}],
                },
                {"type": "compaction", "content": "Earlier: the user asked about the weather."},
                {"type": "future_block_type", "payload": {"any": ["shape", 1]}},
                {"type": "text", "text": "Checking.", "citations": None},
                tool_use("toolu_1", "Bash", {"command": "ls"}),
            ],
        },
        DEVELOPER_TURN,
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "a.py"}],
                    "cache_control": {"type": "ephemeral"},
                },
                {"type": "text", "text": "<system-reminder>todo list empty</system-reminder>"},
                {"type": "text", "text": "And now?"},
            ],
        },
        {"role": "system", "content": "Reminder: the user prefers short answers."},
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_system_turns_and_every_block_pass_in_place(
    proxy: ProxyProcess, upstream: FakeOpenAI, stream: bool
) -> None:
    """system and developer turns anywhere in messages (Claude Code's beta header on), and
    every block type (a made-up one included), go upstream byte for byte in their place."""
    blocks = [{"type": "text", "text": "Short answer."}]
    events = anthropic_events(blocks)
    upstream.enqueue(Answer.stream(events) if stream else anthropic_reply(blocks))
    history = every_block_history()
    body = {"model": "m", "max_tokens": 64, "messages": history, "stream": stream}
    beta = {"anthropic-beta": "mid-conversation-system-2026-04-07"}
    said = post(proxy, "/v1/messages", body, **beta)
    assert (b"".join(events) if stream else message(blocks)) == (
        said.content if stream else said.json()
    )
    [request] = upstream.requests
    assert history == request.body["messages"]
    assert "mid-conversation-system-2026-04-07" == request.headers["anthropic-beta"]


def test_what_no_provider_could_accept_is_refused_by_name(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """A top-level system that is a number, a turn that is not an object, content that is
    neither text nor blocks, an unknown role: a 400 naming the field; nothing goes upstream."""
    hi = {"role": "user", "content": "hi"}
    cases = [
        ({"system": 5, "messages": [hi]}, "system: expected a string or a list of content blocks"),
        ({"messages": [hi, "nope"]}, "messages[1]: expected a turn object"),
        ({"messages": [{"role": "user", "content": 7}]}, "messages[0].content: expected"),
        ({"messages": [hi, {"role": "critic", "content": "x"}]}, "messages[1].role: 'critic'"),
        ({"messages": [{"role": "user", "content": ["text"]}]}, "messages[0].content: expected"),
    ]
    for extra, said in cases:
        reply = post(proxy, "/v1/messages", {"model": "m", "max_tokens": 8, **extra})
        assert 400 == reply.status_code
        assert said in reply.json()["error"]["message"]
    client = openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0, timeout=60)
    with (
        client,
        pytest.raises(openai.BadRequestError, match=r"input\[1\]: unknown message role 'critic'"),
    ):
        client.responses.create(model="m", input=[hi, {"role": "critic", "content": "x"}])  # type: ignore[list-item, misc]
    assert [] == upstream.requests


def test_responses_items_of_every_kind_pass_in_place(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """system and developer messages anywhere in input, compaction, reasoning, item
    references, shell, custom-tool and built-in tool calls, and a made-up item type go
    upstream byte for byte in their place."""
    items = [
        {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAB-compacted=="},
        {"role": "developer", "content": "Sandbox: read-only."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go."}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB-r=="},
        {
            "type": "web_search_call",
            "id": "ws_1",
            "status": "completed",
            "action": {"type": "search", "query": "x"},
        },
        call_item("call_1", "exec_command", '{"cmd": "ls"}'),
        {"type": "function_call_output", "call_id": "call_1", "output": "a.py"},
        {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** x"},
        {"type": "custom_tool_call_output", "call_id": "call_2", "output": "applied"},
        {"role": "system", "content": "Mid-conversation system note."},
        {"type": "item_reference", "id": "msg_0"},
        {"type": "future_item_type", "payload": [1, {"a": None}]},
        text_item("Listed.", "msg_a"),
        {"role": "developer", "content": [{"type": "input_text", "text": "Turn 2 rules."}]},
        {"role": "user", "content": "Next?"},
    ]
    upstream.enqueue(responses_reply([text_item("Fine.")]))
    client = openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0, timeout=60)
    with client:
        reply = client.responses.create(
            model="m", input=copy.deepcopy(items), prompt_cache_key="k1"
        )  # type: ignore[arg-type]
    assert "Fine." == reply.output_text
    [request] = upstream.requests
    assert items == request.body["input"]


# ---------------------------------------------------------------------- the proxy's tools


def test_the_proxys_tools_are_the_same_from_the_first_request(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """From a session's first request (nothing to recall yet, no user id) to its later ones,
    in every format, the proxy adds recall and search after the app's tools, byte for byte
    the same."""
    app_tool = {"name": "Bash", "description": "run", "input_schema": {"type": "object"}}
    history: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
    for turn in range(3):
        upstream.enqueue(anthropic_reply([{"type": "text", "text": f"Reply {turn}."}]))
        body = {"model": "m", "max_tokens": 8, "tools": [app_tool], "messages": history}
        assert 200 == post(proxy, "/v1/messages", body, **{"X-Session-Id": "stable"}).status_code
        history = [
            *history,
            {"role": "assistant", "content": f"Reply {turn}."},
            {"role": "user", "content": f"more {turn} " + HUGE[: 3000 * turn]},
        ]
    chat_history: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    for turn in range(2):
        upstream.reply(f"chat {turn}")
        body = {"model": "m", "messages": chat_history}
        post(proxy, "/v1/chat/completions", body, **{"X-Session-Id": "stable-chat"})
        chat_history = [
            *chat_history,
            {"role": "assistant", "content": f"chat {turn}"},
            {"role": "user", "content": "on"},
        ]
    for turn in range(2):
        upstream.enqueue(responses_reply([text_item(f"resp {turn}")]))
        body = {
            "model": "m",
            "input": [{"role": "user", "content": "x" * (turn + 1)}],
            "prompt_cache_key": "stable-r",
        }
        post(proxy, "/v1/responses", body)

    by_route: dict[str, list[str]] = {}
    for request in upstream.requests:
        route = request.path.split("?")[0]
        by_route.setdefault(route, []).append(json.dumps(request.body["tools"]))
    assert {"/v1/messages", "/v1/chat/completions", "/v1/responses"} == by_route.keys()
    for route, tools in by_route.items():
        assert len(set(tools)) == 1, route
        assert OWN_TOOLS == names(json.loads(tools[0]))[-2:]
    assert ["Bash", *OWN_TOOLS] == names(json.loads(by_route["/v1/messages"][0]))


def offloaded_history() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Dump the table."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_t",
                    "type": "function",
                    "function": {"name": "dump", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_t", "content": HUGE},
        {"role": "assistant", "content": "Dumped it."},
        {"role": "user", "content": "Read all of it back, every row."},
    ]


def greedy_model(body: Any) -> Answer:
    """Asks for the whole offloaded text (limit 1e8) and a search with limit 999, after
    saying so; answers once it has both."""
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return Answer.reply("Read it.")
    ref = REF_PATTERN.search(json.dumps(messages))
    assert ref is not None
    calls = [
        {
            "id": "call_r",
            "type": "function",
            "function": {
                "name": "recall_tool_result",
                "arguments": json.dumps({"ref": ref.group(0), "limit": 1e8}),
            },
        },
        {
            "id": "call_s",
            "type": "function",
            "function": {"name": "search_memory", "arguments": '{"query": "row 7", "limit": 999}'},
        },
    ]
    return Answer.reply("Reading it all.", "tool_calls", tool_calls=calls)


def test_tool_arguments_are_clamped_to_keep_the_request_within_b(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """recall_tool_result with limit 1e8 and search_memory with limit 999 (after text):
    both answered, the continued upstream request stays within B (the engine's metric),
    and X-Ragent-Chars-Out says what that last request carried (the recall and memory
    blocks aside, as for every request)."""
    upstream.default = greedy_model
    client = openai.OpenAI(
        base_url=proxy.base_url,
        api_key=KEY,
        default_headers={"X-Session-Id": "greedy"},
        max_retries=0,
        timeout=60,
    )
    with client:
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=offloaded_history()
        )
    assert "Read it." == raw.parse().choices[0].message.content
    _, last = (r.body for r in upstream.requests)
    measured = sum(chars(m) for m in last["messages"])
    assert measured <= B
    recalled = last["messages"][-2]["content"]
    assert (
        recalled.startswith("row 0: the stored figure is 0.")
        and "call again with offset=" in recalled
    )
    blocks = int(raw.headers["x-ragent-recalled-chars"]) + int(raw.headers["x-ragent-memory-chars"])
    assert str(measured - blocks) == raw.headers["x-ragent-chars-out"]  # the blocks aside
    assert "1" == raw.headers["x-ragent-tool-rounds"]


def test_clamps_and_fits_without_a_server() -> None:
    """A recall limit past the room is cut to it (its footer's room kept), a missing one
    too when the default would not fit; a search limit past the tool's maximum is 20;
    arguments of the wrong type are left for the tool to refuse; an answer past the room
    is cut, and with almost none left says so."""
    assert {"ref": "rm-1", "limit": 800} == limited(
        "recall_tool_result", '{"ref": "rm-1", "limit": 1e8}', 1_000
    )
    assert {"ref": "rm-1", "limit": 300} == limited("recall_tool_result", {"ref": "rm-1"}, 500)
    assert {"ref": "rm-1", "limit": 50} == limited(
        "recall_tool_result", {"ref": "rm-1", "limit": 50}, 500
    )
    assert {"ref": "rm-1", "limit": "lots"} == limited(
        "recall_tool_result", {"ref": "rm-1", "limit": "lots"}, 500
    )
    assert {"query": "q", "limit": 20} == limited(
        "search_memory", {"query": "q", "limit": "999"}, 10
    )
    assert "not json" == limited("search_memory", "not json", 10)
    assert "short" == fitted("short", 100)
    assert 200 == len(fitted("x" * 500, 200))
    assert NO_ROOM == fitted("x" * 500, 10)


def test_text_then_a_proxy_call_in_a_whole_reply_is_answered(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """Messages, not streamed: text then a search_memory call is answered and the model asked
    again; the app gets the last reply with end_turn."""
    upstream.enqueue(
        anthropic_reply(
            [
                {"type": "text", "text": "Let me search."},
                tool_use("toolu_s", "search_memory", {"query": "x"}),
            ]
        )
    )
    upstream.enqueue(anthropic_reply([{"type": "text", "text": "Nothing earlier."}]))
    body = {
        "model": "m",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Did we talk?"}],
    }
    reply = post(proxy, "/v1/messages", body, **{"X-Session-Id": "whole-after-text"}).json()
    assert ([{"type": "text", "text": "Nothing earlier."}], "end_turn") == (
        reply["content"],
        reply["stop_reason"],
    )
    asked, answered = sent_to(upstream, "/v1/messages")[1]["messages"][-2:]
    assert "search_memory" == asked["content"][-1]["name"]
    assert "toolu_s" == answered["content"][0]["tool_use_id"]


def test_text_then_a_proxy_call_in_a_whole_response_is_answered(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """Responses, not streamed: a message then a search_memory call is answered and the model
    asked again; the app gets the last response only."""
    said = [
        text_item("Let me search.", "msg_s"),
        call_item("call_s", "search_memory", '{"query": "x"}'),
    ]
    upstream.enqueue(responses_reply(said))
    upstream.enqueue(responses_reply([text_item("Nothing earlier.", "msg_t")]))
    body = {"model": "m", "input": "Did we talk?", "prompt_cache_key": "whole-r"}
    got = post(proxy, "/v1/responses", body).json()
    assert ["msg_t"] == [item["id"] for item in got["output"]]
    sent = sent_to(upstream, "/v1/responses")[1]["input"]
    assert ["message", "message", "function_call", "function_call_output"] == [
        i.get("type", "message") for i in sent
    ]


@pytest.mark.parametrize("text", [True, False])
def test_a_streamed_proxy_call_beside_the_apps_is_answered_and_spliced(
    proxy: ProxyProcess, upstream: FakeOpenAI, text: bool
) -> None:
    """Messages, streamed: (text,) a search_memory call and the app's Bash call in one
    reply. The app sees its own blocks only (stop_reason tool_use, gapless indices) and
    continues; its next request reaches the model with the proxy's call beside the app's
    and both results in the next user turn."""
    ours = tool_use("toolu_ours", "search_memory", {"query": "earlier"})
    theirs = tool_use("toolu_app", "Bash", {"command": "ls"})
    blocks = [{"type": "text", "text": "Two things."}, ours, theirs][0 if text else 1 :]
    upstream.enqueue(Answer.stream(anthropic_events(blocks)))
    client = anthropic.Anthropic(
        base_url=proxy.root_url,
        api_key=KEY,
        default_headers={"X-Session-Id": f"mixed-stream-{text}"},
        max_retries=0,
        timeout=60,
    )
    history: list[dict[str, Any]] = [{"role": "user", "content": "Look around."}]
    bash = {"name": "Bash", "description": "run", "input_schema": {"type": "object"}}
    with (
        client,
        client.messages.stream(model="m", max_tokens=64, messages=history, tools=[bash]) as stream,
    ):  # type: ignore[list-item]
        final = stream.get_final_message()
    assert ["text", "tool_use"][0 if text else 1 :] == [b.type for b in final.content]
    assert ("toolu_app", "tool_use") == (final.content[-1].id, final.stop_reason)  # type: ignore[union-attr]
    assert 1 == len(upstream.requests)

    upstream.enqueue(anthropic_reply([{"type": "text", "text": "Both seen."}]))
    kept = {
        "role": "assistant",
        "content": [b.model_dump(exclude_none=True) for b in final.content],
    }
    result = {"type": "tool_result", "tool_use_id": "toolu_app", "content": "a.py"}
    later = [*history, kept, {"role": "user", "content": [result]}]
    body = {"model": "m", "max_tokens": 64, "messages": later, "tools": [bash]}
    post(proxy, "/v1/messages", body, **{"X-Session-Id": f"mixed-stream-{text}"})
    asked, answered = sent_to(upstream, "/v1/messages")[1]["messages"][-2:]
    assert [b["type"] for b in blocks] == [b["type"] for b in asked["content"]]
    assert ["toolu_ours", "toolu_app"] == [b["tool_use_id"] for b in answered["content"]]
    assert result == answered["content"][1]


def test_a_responses_proxy_call_beside_the_apps_is_answered_and_spliced(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """Responses, whole: the proxy's call beside the app's is answered, the app gets its own
    call only, and its next request carries the proxy's call and output in place."""
    output = [
        call_item("call_ours", "search_memory", '{"query": "x"}', "fc_o"),
        call_item("call_app", "shell", '{"cmd": "ls"}', "fc_a"),
    ]
    upstream.enqueue(Answer(payload=response(output)))
    start = [{"role": "user", "content": "Go."}]
    body = {"model": "m", "input": start, "prompt_cache_key": "mixed-r"}
    got = post(proxy, "/v1/responses", body).json()
    assert ["call_app"] == [i["call_id"] for i in got["output"]]

    upstream.enqueue(responses_reply([text_item("ok")]))
    done = {"type": "function_call_output", "call_id": "call_app", "output": "a.py"}
    post(proxy, "/v1/responses", {**body, "input": [*start, *got["output"], done]})
    sent = sent_to(upstream, "/v1/responses")[1]["input"]
    assert ["call_ours", "call_app", "call_ours", "call_app"] == [i["call_id"] for i in sent[1:]]
    assert sent[-1] == done


# ---------------------------------------------------------------------- splices, unit


def test_splices_stand_in_place_of_the_reply_the_app_kept() -> None:
    """A kept reply (text whitespace aside, its call ids) at its position is replaced by
    what the model saw, the same objects every time; an edited reply or another position
    is left alone; each session keeps its latest splices only."""
    splices = Splices(per_session=2)
    reply = {"role": "assistant", "content": "Let me look. Found it."}
    seen = [
        {"role": "assistant", "content": "Let me look."},
        {"role": "tool", "tool_call_id": "c", "content": "r"},
    ]
    splices.record("s", 1, reply, seen)
    history = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "Let me look.  Found it.\n"},
    ]
    once, twice = splices.apply("s", history), splices.apply("s", list(history))
    assert once[1:] == seen and all(a is b for a, b in zip(once, twice, strict=True))
    edited = [history[0], {"role": "assistant", "content": "Something else."}]
    assert edited is splices.apply("s", edited)
    assert history is splices.apply("other", history)
    splices.record("s", 3, reply, seen)
    splices.record("s", 5, reply, seen)
    assert history == splices.apply("s", history)  # position 1 was the oldest: dropped


def test_splices_are_bounded_in_characters_and_sessions() -> None:
    """Past the character bound the least recently used session's splices go first; past
    the session bound the least recently used session goes; the count stays true."""
    reply = {"role": "assistant", "content": "r"}
    seen = [
        {"role": "assistant", "content": "x" * 100},
        {"role": "tool", "tool_call_id": "c", "content": "y"},
    ]
    splices = Splices(max_chars=250, sessions=3)
    for session in ("a", "b"):
        splices.record(session, 1, reply, seen)
    assert 202 == splices.chars
    splices.apply("a", [reply, reply])  # a is now the most recently used
    splices.record("c", 1, reply, seen)
    history = [{"role": "user", "content": "q"}, reply]
    assert (202, history) == (splices.chars, splices.apply("b", history))
    assert seen == splices.apply("a", history)[1:]
    for session in ("d", "e", "f"):
        splices.record(session, 1, {"role": "assistant", "content": "s"}, [reply, reply])
    assert history == splices.apply("a", history)
    assert 6 == splices.chars


def test_the_way_back_keeps_system_turns_where_they_were() -> None:
    """A system or developer turn translated to the engine is a system message that goes
    back as that turn in its place, even first in messages; a top-level system stays top
    level; the engine's own user text is never made a system turn."""
    body = {"system": "S", "messages": every_block_history()}
    engine = messages_wire.to_engine(body)
    system, turns, _ = messages_wire.from_engine(engine)
    assert ("S", body["messages"]) == (system, turns)
    first = {"messages": [SYSTEM_TURN, {"role": "user", "content": "hi"}]}
    assert (None, first["messages"]) == messages_wire.from_engine(messages_wire.to_engine(first))[
        :2
    ]
    assert responses_wire.from_engine(
        responses_wire.to_engine(
            {"input": [{"role": "developer", "content": "d"}, {"role": "user", "content": "u"}]}
        )
    )[1][0] == {"role": "developer", "content": "d"}


def test_a_stream_round_after_text_in_chat_completions_goes_on(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """Chat completions, streamed: the next round's chunks follow the first round's text
    in one stream, under the first round's id, with one [DONE]."""
    upstream.enqueue(
        Answer.stream(sse_events(["Checking."], tool_calls=[("search_memory", '{"query": "q"}')]))
    )
    upstream.enqueue(Answer.stream(sse_events([" Nothing."], chunk_id="b")))
    with httpx2.stream(
        "POST",
        proxy.base_url + "/chat/completions",
        json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "q?"}]},
        headers={"authorization": f"Bearer {KEY}", "X-Session-Id": "chat-on"},
        timeout=60,
    ) as raw:
        streamed = b"".join(raw.iter_bytes()).decode()
    assert 1 == streamed.count("[DONE]") and streamed.rstrip().endswith("data: [DONE]")
    chunks = [json.loads(line[6:]) for line in streamed.splitlines() if line.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert "Checking. Nothing." == text
    assert {"chatcmpl-s"} == {c["id"] for c in chunks}  # the second round's as the first's
    assert ["stop"] == [
        c["choices"][0]["finish_reason"]
        for c in chunks
        if c["choices"] and c["choices"][0]["finish_reason"]
    ]


def test_streamed_proxy_calls_beside_the_apps_in_responses_and_chat(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """Responses and chat completions, streamed: the proxy's call beside the app's is cut
    (the app's renumbered, gapless) and answered; the app's next request carries it and its
    answer in place, every call answered."""
    output = [
        text_item("Both."),
        call_item("call_ours", "search_memory", '{"query": "x"}', "fc_o"),
        call_item("call_app", "shell", '{"cmd": "ls"}', "fc_a"),
    ]
    upstream.enqueue(Answer.stream(responses_events(output)))
    client = openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0, timeout=60)
    start = [{"role": "user", "content": "Go."}]
    with (
        client,
        client.responses.stream(model="m", input=start, prompt_cache_key="mixed-rs") as stream,
    ):  # type: ignore[arg-type]
        indices = [e.output_index for e in stream if e.type == "response.output_item.added"]
        final = stream.get_final_response()
    assert ([0, 1], ["message", "function_call"]) == (indices, [i.type for i in final.output])
    upstream.enqueue(responses_reply([text_item("ok")]))
    kept = [i.model_dump(exclude_none=True) for i in final.output]
    done = {"type": "function_call_output", "call_id": "call_app", "output": "a.py"}
    body = {"model": "m", "input": [*start, *kept, done], "prompt_cache_key": "mixed-rs"}
    post(proxy, "/v1/responses", body)
    sent = sent_to(upstream, "/v1/responses")[1]["input"]
    assert ["call_ours", "call_app", "call_ours", "call_app"] == [
        i["call_id"] for i in sent if "call_id" in i
    ]

    upstream.reset()
    calls = [("search_memory", '{"query": "y"}'), ("lookup", "{}")]
    upstream.enqueue(Answer.stream(sse_events(["Both."], tool_calls=calls, chunk_id="m")))
    chat = [{"role": "user", "content": "Go."}]
    with httpx2.stream(
        "POST",
        proxy.base_url + "/chat/completions",
        json={"model": "m", "stream": True, "messages": chat},
        headers={"authorization": f"Bearer {KEY}", "X-Session-Id": "mixed-chat"},
        timeout=60,
    ) as raw:
        streamed = b"".join(raw.iter_bytes()).decode()
    chunks = [json.loads(line[6:]) for line in streamed.splitlines() if line.startswith("data: {")]
    seen = [c for ch in chunks for c in ch["choices"][0]["delta"].get("tool_calls") or ()]
    assert ["lookup"] == [c["function"]["name"] for c in seen]
    assert "tool_calls" == chunks[-1]["choices"][0]["finish_reason"]
    kept_call = {
        "id": seen[0]["id"],
        "type": "function",
        "function": {"name": "lookup", "arguments": "{}"},
    }
    upstream.reply("fine")
    later = [
        *chat,
        {"role": "assistant", "content": "Both.", "tool_calls": [kept_call]},
        {"role": "tool", "tool_call_id": seen[0]["id"], "content": "found"},
    ]
    post(
        proxy,
        "/v1/chat/completions",
        {"model": "m", "messages": later},
        **{"X-Session-Id": "mixed-chat"},
    )
    asked, ours, theirs = upstream.requests[1].body["messages"][-3:]
    assert ["search_memory", "lookup"] == [c["function"]["name"] for c in asked["tool_calls"]]
    assert (ours["role"], theirs) == ("tool", later[-1])


def test_a_refused_round_after_text_ends_the_stream_with_an_error(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """When the upstream refuses the round that would follow the app's streamed text, the
    stream ends with the format's error event saying so, not a reply cut short silently."""
    blocks = [
        {"type": "text", "text": "Let me search."},
        tool_use("toolu_f", "search_memory", {"query": "q"}),
    ]
    upstream.enqueue(Answer.stream(anthropic_events(blocks)))
    upstream.status(500)
    body = {
        "model": "m",
        "max_tokens": 64,
        "stream": True,
        "messages": [{"role": "user", "content": "q?"}],
    }
    said = post(proxy, "/v1/messages", body, **{"X-Session-Id": "refused-round"}).text
    events = [json.loads(line[6:]) for line in said.splitlines() if line.startswith("data: ")]
    deltas = [e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta"]
    assert "Let me search." == "".join(deltas)
    assert said.rstrip().endswith("}") and "event: error" in said
    assert "upstream answered 500 to the proxy's tool round" in said
    assert "message_stop" not in said


def searching_model(body: Any) -> Answer:
    """Says something and searches again whenever the proxy's tools are offered."""
    if "tools" not in body:
        return Answer.reply("Final answer.")
    rounds = sum(1 for m in body["messages"] if m["role"] == "tool")
    call = {
        "id": f"call_{rounds}",
        "type": "function",
        "function": {"name": "search_memory", "arguments": json.dumps({"query": f"q{rounds}"})},
    }
    return Answer.reply(f"Searching {rounds}.", "tool_calls", tool_calls=[call])


def test_every_round_the_model_saw_comes_back_in_the_apps_next_request(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """A model that keeps searching gets serve.max_tool_rounds rounds, then a last request
    without the proxy's tools; the app gets the last reply, and its next request carries
    every round (text, call, answer) before that reply, in order."""
    upstream.default = searching_model
    client = openai.OpenAI(
        base_url=proxy.base_url,
        api_key=KEY,
        default_headers={"X-Session-Id": "rounds"},
        max_retries=0,
        timeout=60,
    )
    start = [{"role": "user", "content": "Find it."}]
    with client:
        raw = client.chat.completions.with_raw_response.create(model="m", messages=start)
        kept = raw.parse().choices[0].message.model_dump(exclude_none=True)
        client.chat.completions.create(
            model="m", messages=[*start, kept, {"role": "user", "content": "Thanks."}]
        )
    assert ("Final answer.", "3") == (kept["content"], raw.headers["x-ragent-tool-rounds"])
    assert 8 == len(upstream.requests)  # the next request searches three times again
    last_round = upstream.requests[3].body["messages"]
    assert "tools" not in upstream.requests[3].body
    again = upstream.requests[4].body["messages"]
    assert last_round[1:] == again[1 : len(last_round)]  # the three rounds, as the model saw them
    assert ["Searching 0.", "Searching 1.", "Searching 2."] == [
        m["content"] for m in again if m["role"] == "assistant" and m.get("tool_calls")
    ]
    assert {"role": "assistant", "content": "Final answer."} == again[len(last_round)]


def test_a_stream_of_several_choices_gets_no_rounds(
    proxy: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """Chat completions with n = 2, streamed: the proxy's call after text is cut, not
    answered (which choice would the next round continue?), as for a whole reply."""
    calls = [("search_memory", '{"query": "q"}')]
    upstream.enqueue(Answer.stream(sse_events(["Checking."], tool_calls=calls)))
    body = {"model": "m", "stream": True, "n": 2, "messages": [{"role": "user", "content": "q?"}]}
    streamed = post(proxy, "/v1/chat/completions", body, **{"X-Session-Id": "two-choices"}).text
    assert 1 == len(upstream.requests)
    assert "search_memory" not in streamed and streamed.rstrip().endswith("data: [DONE]")
