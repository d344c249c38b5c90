"""``ragent-memory serve`` where hostile callers can reach it: the real server (a subprocess on
127.0.0.1) attacked with raw sockets — half-sent bodies and heads, many connections from one
address (127.0.0.2 … on the loopback network), paths that climb out of the upstream's base —
while honest callers, the real ``openai`` client among them, still get answers."""

from __future__ import annotations

import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from fake_openai import Answer, FakeOpenAI, sse_events
from serve_process import ProxyProcess, write_config

WAIT_S = 60.0  # every socket read and every wait is bounded by this
SLOTS = 4  # serve.max_concurrency of the attacked proxy
PER_PEER = 6  # serve.max_connections_per_peer of the attacked proxy
HISTORY = [{"role": "user", "content": "hi"}]
SLOW_BODY = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
    b"X-Session-Id: slow\r\nContent-Length: 1000\r\n\r\n"
    b'{"model": "m", "messages": ['
)
PARTIAL_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nX-Sess"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("exposed")


@pytest.fixture(scope="module")
def attacked(workdir: Path, upstream_server: FakeOpenAI) -> Iterator[ProxyProcess]:
    """A proxy with few slots and a small per-peer bound (its time bounds at their defaults)."""
    config = write_config(
        workdir,
        "attacked",
        budget=20_000,
        max_concurrency=SLOTS,
        max_connections_per_peer=PER_PEER,
    )
    with ProxyProcess(config, upstream_server.base_url, cwd=workdir) as process:
        yield process


@pytest.fixture(scope="module")
def hurried(workdir: Path, upstream_server: FakeOpenAI) -> Iterator[ProxyProcess]:
    """A proxy that gives a caller one second for a head and one for a body."""
    config = write_config(
        workdir, "hurried", budget=20_000, header_timeout_s=1.0, body_timeout_s=1.0
    )
    with ProxyProcess(config, upstream_server.base_url, cwd=workdir) as process:
        yield process


def port_of(proxy: ProxyProcess) -> int:
    return int(urllib.parse.urlsplit(proxy.base_url).port or 0)


def connect(proxy: ProxyProcess, source: str = "127.0.0.1") -> socket.socket:
    """A raw connection to the proxy from ``source`` (any 127.x address is this machine)."""
    sock = socket.create_connection(
        ("127.0.0.1", port_of(proxy)), timeout=WAIT_S, source_address=(source, 0)
    )
    sock.settimeout(WAIT_S)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the proxy sends until it closes the connection (bounded by ``WAIT_S``)."""
    chunks = []
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65_536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def still_open(sock: socket.socket) -> bool:
    """Whether the proxy has neither answered nor closed ``sock`` yet."""
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)  # an answer, or b"" for a closed connection
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)
        sock.settimeout(WAIT_S)


def get(proxy: ProxyProcess, target: bytes) -> tuple[int, bytes]:
    """A raw ``GET target`` (sent exactly as given, never normalised): status and body."""
    with connect(proxy) as sock:
        sock.sendall(
            b"GET %s HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer sk-k\r\n"
            b"Connection: close\r\n\r\n" % target
        )
        answer = read_all(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


# ---------------------------------------------------------------------- slow senders


def held_stream(proxy: ProxyProcess, session: str, first: threading.Event, out: list[Any]) -> None:
    """One honest streaming request: ``first`` is set once its first event arrived."""
    client = proxy.keep(
        openai.OpenAI(
            base_url=proxy.base_url,
            api_key="sk-honest",
            default_headers={"X-Session-Id": session},
            max_retries=0,
            timeout=WAIT_S,
        )
    )
    try:
        with client.chat.completions.with_streaming_response.create(
            model="m", messages=HISTORY, stream=True
        ) as response:
            pieces = response.iter_bytes()
            next(pieces)
            first.set()
            out.append(b"".join(pieces))
    except Exception as err:  # the test reports it
        out.append(err)
        first.set()


def test_slow_senders_hold_no_slot_and_one_address_holds_few_connections(
    attacked: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """Twelve connections that sent a head and part of a body, and six that sent part of a
    head, leave every in-flight slot to honest callers; one address gets at most
    serve.max_connections_per_peer connections (the next is answered 429 and closed)."""
    slow = [connect(attacked, "127.0.0.2") for _ in range(PER_PEER)]
    slow += [connect(attacked, "127.0.0.3") for _ in range(PER_PEER)]
    heads = [connect(attacked, "127.0.0.4") for _ in range(PER_PEER)]
    try:
        for sock in slow:
            sock.sendall(SLOW_BODY)
        for sock in heads:
            sock.sendall(PARTIAL_HEAD)
        with connect(attacked, "127.0.0.2") as extra:  # accepted after the six before it
            refused = read_all(extra)
        assert refused.startswith(b"HTTP/1.1 429 "), refused
        assert b"serve.max_connections_per_peer" in refused
        assert {"status": "ok"} == httpx2.get(attacked.root_url + "/healthz").json()

        go_on = threading.Event()
        events = sse_events(["a", "b"])  # held after its first text (the role chunk says nothing)
        upstream.enqueue(Answer.stream(events, hold=go_on, hold_after=2), times=SLOTS)
        firsts = [threading.Event() for _ in range(SLOTS)]
        outs: list[list[Any]] = [[] for _ in range(SLOTS)]
        threads = [
            threading.Thread(target=held_stream, args=(attacked, f"honest-{n}", firsts[n], outs[n]))
            for n in range(SLOTS)
        ]
        for thread in threads:
            thread.start()
        admitted = sum(first.wait(WAIT_S) and not outs[n] for n, first in enumerate(firsts))
        try:
            assert SLOTS == admitted, f"slots left to honest callers: {admitted} of {SLOTS}: {outs}"
            with pytest.raises(openai.InternalServerError) as busy:  # the bound itself holds
                attacked.keep(
                    openai.OpenAI(
                        base_url=attacked.base_url,
                        api_key="sk-honest",
                        max_retries=0,
                        timeout=WAIT_S,
                    )
                ).chat.completions.create(model="m", messages=HISTORY, user="one-more")
            assert "serve.max_concurrency" in busy.value.message
        finally:
            go_on.set()
            for thread in threads:
                thread.join(WAIT_S)
        assert all(isinstance(out[0], bytes) and b"[DONE]" in out[0] for out in outs), outs
        assert all(still_open(sock) for sock in slow + heads), "an attacker was let go early"
    finally:
        for sock in slow + heads:
            sock.close()
    chat = [r for r in upstream.requests if r.path == "/v1/chat/completions"]
    assert SLOTS == len(chat)  # no attacker's request reached the upstream


def test_a_body_not_in_within_body_timeout_is_408_and_closed(
    hurried: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """A body still incomplete serve.body_timeout_s after its head gets a 408 naming the
    setting, and the connection is closed; the same on the count_tokens passthrough."""
    for path in (b"/v1/chat/completions", b"/v1/messages/count_tokens"):
        with connect(hurried) as sock:
            sent = time.monotonic()
            sock.sendall(SLOW_BODY.replace(b"/v1/chat/completions", path))
            answer = read_all(sock)
            waited = time.monotonic() - sent
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b"serve.body_timeout_s" in answer
        assert b"connection: close" in answer.lower()
        assert 0.9 <= waited < WAIT_S
    assert [] == upstream.requests


def test_a_head_not_in_within_header_timeout_is_closed(hurried: ProxyProcess) -> None:
    """A head still incomplete serve.header_timeout_s after the connection opened gets a 408
    and the connection closed; on a kept-alive connection, a next head that stalls gets the
    connection closed (no 408 that could answer a request being sent)."""
    with connect(hurried) as sock:
        sent = time.monotonic()
        sock.sendall(PARTIAL_HEAD)
        answer = read_all(sock)
        waited = time.monotonic() - sent
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"serve.header_timeout_s" in answer
    assert 0.9 <= waited < WAIT_S

    with connect(hurried) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: proxy\r\n\r\n")
        first = b""
        while b'{"status":"ok"}' not in first:
            chunk = sock.recv(65_536)
            assert chunk, first
            first += chunk
        sock.sendall(b"GET /heal")
        assert b"" == read_all(sock)


def test_a_body_sent_in_pieces_within_the_bound_is_served(
    hurried: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """A body that arrives in pieces, whole before serve.body_timeout_s, is answered."""
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    with connect(hurried) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nX-Session-Id: paced\r\n"
            b"Content-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        for start in range(0, len(body), 24):
            sock.sendall(body[start : start + 24])
            time.sleep(0.1)  # the pacing is what is tested
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    assert 1 == len(upstream.requests)


# ---------------------------------------------------------------------- paths


@pytest.mark.parametrize(
    "target",
    [
        b"/v1/models/../../admin/keys",
        b"/v1/models/%2e%2e/%2E%2E/admin/keys",
        b"/v1/models/x%2F..%2F..%2Fadmin%2Fkeys",
        b"/v1/models/..%5C..%5Cadmin",
        b"/v1/models/./../admin",
    ],
)
def test_a_path_that_climbs_out_of_the_upstream_base_is_refused(
    attacked: ProxyProcess, upstream: FakeOpenAI, target: bytes
) -> None:
    """``/v1/models/{id}`` with a ``..`` or ``.`` segment (plain, percent-encoded, behind an
    encoded slash or backslash) is a 400 naming the path; the upstream sees nothing."""
    status, body = get(attacked, target)
    assert 400 == status, body
    assert b"upstream's base path" in body
    assert [] == upstream.requests


def test_model_ids_reach_the_upstream_under_its_base(
    attacked: ProxyProcess, upstream: FakeOpenAI
) -> None:
    """Model ids with slashes and colons reach the upstream as sent, under its base path."""
    for model in (b"meta-llama/Llama-3-8B", b"ft:gpt-4o:org::abc", b"fake-model"):
        status, _ = get(attacked, b"/v1/models/" + model)
        assert 404 == status  # the scripted upstream lists no single models
    paths = [r.path for r in upstream.requests]
    expected = ["/v1/models/meta-llama/Llama-3-8B", "/v1/models/ft:gpt-4o:org::abc"]
    assert [*expected, "/v1/models/fake-model"] == paths


# ---------------------------------------------------------------------- start-up warnings


def test_an_exposed_anonymous_server_warns_at_start(workdir: Path, upstream: FakeOpenAI) -> None:
    """Bound to 0.0.0.0 with serve.allow_anonymous, the server says at start that anyone
    reaching it shares one memory and that it speaks plain HTTP to any peer."""
    config = write_config(
        workdir,
        "exposed",
        budget=20_000,
        host="0.0.0.0",
        identity="credential",
        allow_anonymous=True,
    )
    with ProxyProcess(config, upstream.base_url, cwd=workdir, verbose=False) as process:
        port = port_of(process)
        assert {"status": "ok"} == httpx2.get(f"http://127.0.0.1:{port}/healthz").json()
    log = process.log
    assert "serve.anonymous_beyond_loopback" in log, log
    assert "serve.allow_anonymous: false" in log
    assert "serve.plain_http_beyond_loopback" in log


def test_a_loopback_server_starts_without_exposure_warnings(attacked: ProxyProcess) -> None:
    """On 127.0.0.1 neither warning is given."""
    assert "beyond_loopback" not in attacked.log, attacked.log


# ---------------------------------------------------------------------- settings and counting


@pytest.mark.parametrize(
    ("section", "key_path"),
    [
        ({"header_timeout_s": 0}, "serve.header_timeout_s"),
        ({"header_timeout_s": 86_400}, "serve.header_timeout_s"),
        ({"body_timeout_s": -1}, "serve.body_timeout_s"),
        ({"body_timeout_s": float("inf")}, "serve.body_timeout_s"),
        ({"max_connections_per_peer": 0}, "serve.max_connections_per_peer"),
        ({"max_connections_per_peer": True}, "serve.max_connections_per_peer"),
    ],
)
def test_bound_settings_out_of_range_name_the_key(section: dict[str, Any], key_path: str) -> None:
    """A time or connection bound out of its range fails at load, naming the key."""
    from ragent_memory import ConfigError
    from ragent_memory.settings import settings_from_dict

    with pytest.raises(ConfigError) as caught:
        settings_from_dict({"serve": section})
    assert key_path == caught.value.key_path


def test_trusted_proxies_are_not_counted_per_address() -> None:
    """A peer in serve.trusted_proxies (a gateway every client comes through) is never refused
    for its number of connections; any other address is, past the bound, until one closes."""
    from ragent_memory.serve.connections import Doorman

    doorman = Doorman(per_peer=2, header_timeout_s=60, exempt=("10.0.0.0/8",))
    gateway = [doorman.admit(("10.1.2.3", port), object()) for port in range(1, 6)]
    other = [doorman.admit(("192.0.2.7", port), object()) for port in range(1, 4)]
    assert [True] * 5 == gateway
    assert [True, True, False] == other
    assert 1 == doorman.refused
    doorman.release(("192.0.2.7", 1))
    assert doorman.admit(("192.0.2.7", 9), object())
    assert {"192.0.2.7": 2} == doorman.open
