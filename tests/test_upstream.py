"""``ragent_memory.serve.upstream``: the proxy's lean HTTP/1.1 client, against a real TCP server on
127.0.0.1 that answers each request with scripted bytes."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Callable
from typing import Any

import pytest

from ragent_memory.serve.upstream import Client, UpstreamBroke, lean_target

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"

Script = Callable[[int, bytes], Any]  # (request number, request bytes) → reply bytes


async def serve(script: Script, run: Callable[[Client], Any], *, read_s: float = 5.0) -> Any:
    """Run ``run`` against a server whose reply to request n is ``script(n, request)``: bytes
    to write (then keep the connection), ``("close", bytes)`` to write and close, or
    ``("hang", bytes)`` to write and wait."""
    requests: list[bytes] = []
    done = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                request = head + await reader.readexactly(length)
                requests.append(request)
                reply = script(len(requests), request)
                if isinstance(reply, tuple):
                    writer.write(reply[1])
                    await writer.drain()
                    if reply[0] == "hang":
                        await done.wait()
                    break
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = Client("127.0.0.1", port, "/v1", limit=4, connect_s=5, read_s=read_s)
    try:
        return await run(client), requests
    finally:
        done.set()
        client.close()
        server.close()


def test_requests_reuse_one_connection_and_send_the_callers_headers() -> None:
    async def run(client: Client) -> list[Any]:
        return [
            await client.post("/chat/completions", b'{"a":1}', [("Authorization", "Bearer k")])
            for _ in range(3)
        ]

    replies, requests = asyncio.run(serve(lambda n, _: OK, run))
    assert [(200, b"{}")] * 3 == [(r.status_code, r.content) for r in replies]
    assert (b"content-type", b"application/json") in replies[0].headers
    first = requests[0]
    assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer k\r\n" in first
    assert first.endswith(b'Content-Length: 7\r\n\r\n{"a":1}')


def test_chunked_gzip_and_until_close_bodies_are_read_whole() -> None:
    """After an informational 100 response too."""
    packed = gzip.compress(b'{"gz":true}')
    replies = {
        1: b"HTTP/1.1 100 Continue\r\n\r\n"
        b'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\n{"c\r\n4\r\n":1}\r\n0\r\n\r\n',
        2: b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(packed)
        + packed,
        3: ("close", b'HTTP/1.0 200 OK\r\n\r\n{"until":"close"}'),
    }

    async def run(client: Client) -> list[bytes]:
        return [(await client.post("/x", b"", [])).content for _ in range(3)]

    contents, _ = asyncio.run(serve(lambda n, _: replies[n], run))
    assert [b'{"c":1}', b'{"gz":true}', b'{"until":"close"}'] == contents


def test_a_connection_closed_while_idle_is_replaced_once() -> None:
    """The upstream closes a kept-alive connection after its reply (as servers do when their
    keep-alive runs out): the next request meets it closed and goes out on a new one."""

    async def run(client: Client) -> list[int]:
        first = await client.post("/x", b"1", [])
        await asyncio.sleep(0)  # let the close arrive, as it would while idle
        return [first.status_code, (await client.post("/x", b"2", [])).status_code]

    script = {1: ("close", OK.replace(b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK\r\nx: y")), 2: OK}
    statuses, requests = asyncio.run(serve(lambda n, _: script[n], run))
    assert [200, 200] == statuses
    assert 2 == len(requests)


def test_a_reply_cut_off_is_an_error_and_not_sent_again() -> None:
    async def run(client: Client) -> None:
        await client.post("/x", b"", [])

    cut = ("close", b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{}")
    with pytest.raises(UpstreamBroke):
        asyncio.run(serve(lambda n, _: cut, run))


def test_a_silent_upstream_times_out() -> None:
    async def run(client: Client) -> None:
        await client.post("/x", b"", [])

    half = ("hang", b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{")
    with pytest.raises(TimeoutError):
        asyncio.run(serve(lambda n, _: half, run, read_s=0.2))


def test_only_plain_http_urls_are_served() -> None:
    assert ("127.0.0.1", 8000, "/v1") == lean_target("http://127.0.0.1:8000/v1/")
    assert ("example.com", 80, "") == lean_target("http://example.com")
    for url in ("https://api.openai.com/v1", "http://u:p@h/v1", "http://h/v1?x=1", "ftp://h"):
        assert lean_target(url) is None
