"""``serve``'s uvicorn protocol hands the app each request body whole: real uvicorn and
httptools code in-process, fed bytes in small pieces through a transport that records."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from ragent_memory.serve.proxy import whole_bodies

LIMIT = 10_000


class Transport(asyncio.Transport):
    """What the protocol writes."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8089), "peername": ("127.0.0.1", 5555)}.get(name, default)

    def write(self, data: Any) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def request(body: bytes, *, chunked: bool = False) -> bytes:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\n"
    if not chunked:
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    pieces = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 999]), body[i : i + 999])
        for i in range(0, len(body), 999)
    )
    return head + b"Transfer-Encoding: chunked\r\n\r\n" + pieces + b"0\r\n\r\n"


def serve_bytes(data: bytes, answers: int) -> tuple[list[list[dict[str, Any]]], Transport]:
    """Feed ``data`` in 700-byte pieces; the body messages each request's app received."""
    received: list[list[dict[str, Any]]] = []

    async def main() -> Transport:
        answered = asyncio.Queue[None]()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            messages = [await receive()]
            while messages[-1].get("more_body"):
                messages.append(await receive())
            received.append(messages)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            answered.put_nowait(None)

        config = Config(app, lifespan="off", log_level="warning")
        config.load()
        protocol_class = whole_bodies(LIMIT)
        assert protocol_class is not None
        protocol = protocol_class(config=config, server_state=ServerState(), app_state={})  # type: ignore[call-arg]
        transport = Transport()
        protocol.connection_made(transport)
        for start in range(0, len(data), 700):
            protocol.data_received(data[start : start + 700])
            await asyncio.sleep(0)  # the app runs between pieces, as between socket reads
        for _ in range(answers):
            await asyncio.wait_for(answered.get(), 10)
        protocol.connection_lost(None)
        return transport

    transport = asyncio.run(main())
    return received, transport


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_reaches_the_app_whole_in_one_message(chunked: bool) -> None:
    """Two kept-alive requests, each body in many pieces: one message each, byte-exact."""
    first, second = bytes(range(256)) * 30, b"second " * 1000
    received, transport = serve_bytes(request(first, chunked=chunked) + request(second), 2)
    assert [[first], [second]] == [[m["body"] for m in messages] for messages in received]
    assert all(m["more_body"] is False for messages in received for m in messages)
    assert 2 == transport.written.count(b"HTTP/1.1 200 OK")


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_limit_goes_through_uvicorns_flow_control(chunked: bool) -> None:
    """Past the limit the app gets what came so far at once and the rest as it comes, as
    uvicorn gives it, so it sees the body is too big; the next request is whole again."""
    big, small = b"b" * (3 * LIMIT), b"s" * (LIMIT // 2)
    received, _ = serve_bytes(request(big, chunked=chunked) + request(small), 2)
    over, after = received
    assert LIMIT < len(over[0]["body"]) < LIMIT + 1000
    assert over[0]["more_body"] is True
    assert big == b"".join(m["body"] for m in over)
    assert [small] == [m["body"] for m in after]
