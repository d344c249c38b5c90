"""Reading along a streamed chat completion (``ragent_memory.serve.stream``, ``chat``), without a network."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

import attrs
from fake_openai import sse_events
from hypothesis import given
from hypothesis import strategies as st

from ragent_memory import MemoryEngine
from ragent_memory.serve import chat, stream
from ragent_memory.serve.chat import identify, report_headers
from ragent_memory.serve.http import response_headers

STREAM = b"".join(
    [
        b": keep-alive\n\n",
        *sse_events(["Hé", "llo"], tool_calls=[("lookup", '{"q": 1}')], chunk_id="t"),
    ]
)


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_splitter_gives_back_every_byte_as_whole_events(cuts: list[int]) -> None:
    """However the bytes arrive, the events joined are the stream, each ending in a blank line."""
    splitter = stream.EventSplitter()
    events: list[bytes] = []
    points = [0, *sorted(cuts), len(STREAM)]
    for start, end in itertools.pairwise(points):
        events += splitter.feed(STREAM[start:end])
    assert b"" == splitter.rest()
    assert STREAM == b"".join(events)
    assert all(event.endswith(b"\n\n") for event in events)
    assert 7 == len(events)


def test_crlf_events_and_an_unterminated_tail() -> None:
    """CRLF-terminated events split too; an unterminated tail is handed back by rest()."""
    splitter = stream.EventSplitter()
    assert [b"data: 1\r\n\r\n"] == splitter.feed(b"data: 1\r\n\r\ndata: 2")
    assert b"data: 2" == splitter.rest()


def test_chunk_of_skips_comments_done_and_junk() -> None:
    """Only JSON objects in data lines are chunks."""
    assert stream.chunk_of(b": ping\n\n") is None
    assert stream.chunk_of(b"data: [DONE]\n\n") is None
    assert stream.chunk_of(b"data: {not json\n\n") is None
    assert {"a": 1} == stream.chunk_of(b'data:{"a":\ndata: 1}\n\n')


def test_reply_builder_spells_the_message() -> None:
    """Deltas of choice 0 add up to the assistant message the client received."""
    builder = chat.ReplyBuilder()
    splitter = stream.EventSplitter()
    for event in splitter.feed(STREAM):
        chunk = stream.chunk_of(event)
        if chunk is not None:
            builder.add(chunk)
    call = {
        "id": "call_t_0",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"q": 1}'},
    }
    assert {"role": "assistant", "content": "Héllo", "tool_calls": [call]} == builder.message()


def test_reply_builder_joins_argument_pieces() -> None:
    """Tool-call arguments streamed in pieces are joined by index."""
    builder = chat.ReplyBuilder()
    pieces = [
        {"index": 0, "id": "c", "function": {"name": "f", "arguments": '{"a"'}},
        {"index": 0, "function": {"arguments": ": 2}"}},
    ]
    for piece in pieces:
        builder.add({"choices": [{"index": 0, "delta": {"tool_calls": [piece]}}]})
    message = builder.message()
    assert {"a": 2} == json.loads(message["tool_calls"][0]["function"]["arguments"])
    assert message["content"] is None


def test_empty_reply_is_an_empty_text_message() -> None:
    """A stream with no deltas still spells a valid assistant message."""
    assert {"role": "assistant", "content": ""} == chat.ReplyBuilder().message()


def test_identify_prefers_headers_then_the_user_field() -> None:
    """X-Session-Id / X-User-Id win; the ``user`` field fills in for both."""
    assert ("s", "u") == identify({"x-session-id": "s", "x-user-id": "u"}, {"user": "f"})
    assert ("f", "f") == identify({}, {"user": "f"})
    assert ("s", None) == identify({"x-session-id": "s"}, {})


def test_report_headers_name_every_field(make_engine: Callable[..., MemoryEngine]) -> None:
    """Every TurnReport figure becomes an X-Ragent-* header."""
    report = make_engine().prepare([{"role": "user", "content": "hi"}], session_id="s").report
    report = attrs.evolve(report, chars_in=9, compacted=True, generation=3)
    headers = report_headers(report, rounds=2)
    assert "9" == headers["X-Ragent-Chars-In"]
    assert "true" == headers["X-Ragent-Compacted"]
    assert "3" == headers["X-Ragent-Generation"]
    assert "2" == headers["X-Ragent-Tool-Rounds"]
    assert "X-Ragent-Skipped-Reason" not in headers


def test_relayed_headers_keep_repeats_and_give_way_to_the_proxys() -> None:
    """The upstream's headers go out lower-cased and in order, a repeated one (two cookies)
    as often as it came; hop-by-hop ones are dropped, and an upstream header named like one
    the proxy sets is replaced by the proxy's."""
    upstream = [
        (b"Set-Cookie", b"a=1"),
        (b"Content-Length", b"5"),
        (b"Set-Cookie", b"b=2"),
        (b"X-Ragent-Chars-In", b"upstream's"),
        (b"Connection", b"keep-alive"),
    ]
    ours = [(b"x-ragent-chars-in", b"7")]
    assert [
        (b"set-cookie", b"a=1"),
        (b"set-cookie", b"b=2"),
        (b"x-ragent-chars-in", b"7"),
    ] == response_headers(upstream, ours)
