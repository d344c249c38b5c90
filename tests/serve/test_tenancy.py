"""The proxy's memory belongs to the caller: ``ragent-memory serve`` as a subprocess
behind the real ``openai`` client, a scripted upstream on 127.0.0.1, and the store read back."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from fake_openai import Answer, FakeOpenAI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_process import ProxyProcess
from sessions import run_cli

from ragent_memory import MemoryEngine, Settings, StoreSettings
from ragent_memory.core.records import AuditRow
from ragent_memory.serve.app import create_app
from ragent_memory.serve.identity import scope_of
from ragent_memory.store import Store, open_store

B = 20_000
ALICE, MALLORY = "sk-alice-1", "sk-mallory-2"
SYSTEM = {"role": "system", "content": "You are a careful assistant."}
PIN_LINE = "My bank PIN is 4417 and my account is at Heron Bank."
QUESTION = "What is my bank PIN at Heron Bank?"


def write_config(directory: Path, name: str, **serve: Any) -> Path:
    config = directory / f"{name}.yaml"
    store = {"path": str(directory / f"{name}.db")}
    section = {"timeout_s": 30, **serve}
    config.write_text(json.dumps({"context_window_chars": B, "store": store, "serve": section}))
    return config


def ask(
    proxy: ProxyProcess,
    key: str,
    session: str,
    user: str | None,
    messages: list[dict[str, Any]],
    **extra: Any,
) -> Any:
    """One chat completion through the real openai client (closed after); the raw response."""
    headers = {"X-Session-Id": session, **({"X-User-Id": user} if user else {})}
    with openai.OpenAI(
        base_url=proxy.base_url, api_key=key, default_headers=headers, max_retries=0, timeout=60
    ) as chat:
        return chat.chat.completions.with_raw_response.create(model="m", messages=messages, **extra)


def rows(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        found = conn.execute(sql, params).fetchall()
    conn.close()
    return found


def store_scope(db: Path, key: str) -> str:
    """The scope of ``key`` under the store's own secret, computed here from the file."""
    [(secret,)] = rows(db, "SELECT value FROM meta WHERE key = 'scope_secret'")
    return scope_of(bytes.fromhex(secret), key)


@pytest.fixture
def upstream(upstream: FakeOpenAI) -> FakeOpenAI:
    """conftest's upstream, answering "Noted." to whatever it is not scripted for."""
    upstream.default = lambda body: "Noted."
    return upstream


def alice_history(turns: int = 30) -> list[dict[str, Any]]:
    """Alice's session: the PIN in turn 2, long enough turns that a summary is applied."""
    history: list[dict[str, Any]] = [SYSTEM]
    for turn in range(1, turns + 1):
        said = PIN_LINE if turn == 2 else f"Turn {turn} notes: " + f"ledger row {turn} " * 45
        history += [{"role": "user", "content": said}, {"role": "assistant", "content": "Noted."}]
    return history


def talk(proxy: ProxyProcess, key: str, session: str, history: list[dict[str, Any]]) -> None:
    """Send ``history`` turn by turn as Alice's user, each call carrying everything before it."""
    for end in range(2, len(history) + 1, 2):
        ask(proxy, key, session, "alice", history[:end])


def sent(upstream: FakeOpenAI, key: str) -> str:
    """Everything the upstream received under ``key``, as one JSON text."""
    bodies = [r.body for r in upstream.requests if r.headers["authorization"] == f"Bearer {key}"]
    return json.dumps(bodies)


@pytest.mark.parametrize("identity", ["credential", "headers"])
def test_another_key_claiming_a_user_reads_and_resets_nothing(
    tmp_path: Path, upstream: FakeOpenAI, identity: str
) -> None:
    """Issue 36's two attacks. By credential (the default): Mallory's key claiming
    ``X-User-Id: alice`` sends nothing of Alice's upstream, and her one-message history under
    Alice's session id leaves Alice's summary alone; Alice's own new session still recalls the
    PIN. ``identity: headers`` (trusting the ids as sent) shows both attacks land, so these
    assertions can fail."""
    config = write_config(tmp_path, identity, identity=identity)
    db = tmp_path / f"{identity}.db"
    with ProxyProcess(config, upstream.base_url, cwd=tmp_path) as first:
        talk(first, ALICE, "a-1", alice_history())
        first.stop()  # a graceful stop runs every after_turn: the PIN is indexed
    alice = f"{store_scope(db, ALICE)}:a-1" if identity == "credential" else "a-1"
    [(generation,)] = rows(
        db,
        "SELECT max(generation) FROM compactions WHERE session_id = ? AND status = 'applied'",
        alice,
    )
    assert generation, "Alice's session was never compacted: the write attack tests nothing"

    upstream.reset()
    with ProxyProcess(config, upstream.base_url, cwd=tmp_path) as second:
        question = [SYSTEM, {"role": "user", "content": QUESTION}]
        ask(second, MALLORY, "m-1", "alice", question)
        ask(second, ALICE, "a-2", "alice", question)
        ask(second, MALLORY, "a-1", "alice", [{"role": "user", "content": "hi"}])
        history = [*alice_history(), {"role": "user", "content": "And my next step?"}]
        after = ask(second, ALICE, "a-1", "alice", history)
    invalidated = rows(
        db,
        "SELECT count(*) FROM compactions WHERE session_id = ? AND status = 'invalidated'",
        alice,
    )
    assert "4417" in sent(upstream, ALICE)
    if identity == "headers":
        assert "4417" in sent(upstream, MALLORY)
        assert [(1,)] == invalidated
        assert 1 == second.log.count("serve.identity_from_headers")
        return
    assert "4417" not in sent(upstream, MALLORY)
    assert [(0,)] == invalidated
    assert (str(generation), "false") == (
        after.headers["x-ragent-generation"],
        after.headers["x-ragent-compacted"],
    )
    assert "serve.identity_from_headers" not in second.log
    for key in (ALICE, MALLORY):
        assert key not in second.log
        assert all(key.encode() not in path.read_bytes() for path in tmp_path.glob("*.db*"))


def test_no_credential_is_a_401_unless_anonymous_is_allowed(
    tmp_path: Path, upstream: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a key the default proxy refuses with a 401 saying why, and sends nothing
    upstream; an ``x-api-key`` is a credential too, scoped under ``serve.secret_env``'s secret.
    With ``allow_anonymous`` the same request is served, under the one anonymous scope."""
    question = [{"role": "user", "content": "hi"}]
    keyless = {"Authorization": openai.Omit()}  # the SDK sends no credential at all
    monkeypatch.setenv("RAGENT_TEST_SCOPE_SECRET", "s" * 32)
    config = write_config(tmp_path, "keyed", secret_env="RAGENT_TEST_SCOPE_SECRET")
    with ProxyProcess(config, upstream.base_url, cwd=tmp_path) as keyed:
        with pytest.raises(openai.AuthenticationError) as caught:
            ask(keyed, "unused", "s", None, question, extra_headers=keyless)
        assert [] == upstream.requests
        by_header = httpx2.post(
            keyed.base_url + "/chat/completions",
            json={"model": "m", "messages": question},
            headers={"X-Session-Id": "s", "x-api-key": ALICE},
        )
        keyed.stop()
    assert 401 == caught.value.status_code
    assert "401 - no credential: send your API key (Authorization" in caught.value.message
    assert 1 == len(caught.value.response.text.strip().splitlines())
    assert 200 == by_header.status_code
    scoped = rows(
        tmp_path / "keyed.db",
        "SELECT DISTINCT ids.value FROM recall_messages JOIN ids ON ids.key = session_key",
    )
    assert [(f"{scope_of(b's' * 32, ALICE)}:s",)] == scoped  # serve.secret_env's scope

    config = write_config(tmp_path, "open", allow_anonymous=True)
    with ProxyProcess(config, upstream.base_url, cwd=tmp_path) as anonymous:
        reply = ask(anonymous, "unused", "s", None, question, extra_headers=keyless).parse()
        anonymous.stop()
    assert "Noted." == reply.choices[0].message.content
    scoped = rows(
        tmp_path / "open.db",
        "SELECT DISTINCT ids.value FROM recall_messages JOIN ids ON ids.key = session_key",
    )
    assert [("anonymous:s",)] == scoped


# ---------------------------------------------------------------- three keys, interleaved

KEYS = ("sk-amber-1", "sk-birch-2", "sk-cedar-3")
WORDS = {key: key.split("-")[1] for key in KEYS}  # each key's own word, said in its text


@pytest.fixture(scope="module")
def shared_proxy(
    tmp_path_factory: pytest.TempPathFactory, upstream_server: FakeOpenAI
) -> Iterator[ProxyProcess]:
    directory = tmp_path_factory.mktemp("tenancy")
    config = write_config(directory, "shared")
    with ProxyProcess(config, upstream_server.base_url, cwd=directory, verbose=False) as proxy:
        yield proxy


STEPS = st.lists(
    st.tuples(
        st.sampled_from(KEYS), st.sampled_from(["s1", "s2"]), st.sampled_from(["u1", "u2", None])
    ),
    min_size=2,
    max_size=8,
)


def searching_model(body: Any) -> Answer:
    """Searches the memory whenever the proxy offers it; otherwise (and after) says Noted."""
    offered = [tool["function"]["name"] for tool in body.get("tools") or ()]
    if body["messages"][-1]["role"] == "tool" or "search_memory" not in offered:
        return Answer.reply("Noted.")
    arguments = '{"query": "vault code word"}'
    call = {
        "id": "s",
        "type": "function",
        "function": {"name": "search_memory", "arguments": arguments},
    }
    return Answer.reply(None, "tool_calls", tool_calls=[call])


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=STEPS)
def test_each_keys_upstream_requests_hold_only_its_own_text(
    shared_proxy: ProxyProcess, upstream_server: FakeOpenAI, steps: list[tuple[str, str, Any]]
) -> None:
    """Three keys claiming the same user and session ids, in any order, on one store: every
    request the upstream gets under a key holds none of the other keys' words (the recall
    block, and ``search_memory`` answered by the proxy), whatever ids they claimed."""
    upstream_server.reset()
    upstream_server.default = searching_model
    histories: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for n, (key, session, user) in enumerate(steps):
        history = histories.setdefault((key, session), [SYSTEM])
        said = f"The vault code word is {WORDS[key]}{n}. What is the vault code word?"
        history.append({"role": "user", "content": said})
        reply = ask(shared_proxy, key, session, user, history).parse()
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    assert len(steps) <= len(upstream_server.requests)
    searched = [r for r in upstream_server.requests if r.body["messages"][-1]["role"] == "tool"]
    assert searched or not any(user for _, _, user in steps)
    for request in upstream_server.requests:
        key = request.headers["authorization"].removeprefix("Bearer ")
        text = json.dumps(request.body)
        assert WORDS[key] in text
        assert [] == [WORDS[other] for other in KEYS if other != key and WORDS[other] in text]


# ---------------------------------------------------------------- behind a gateway


def test_trusted_proxies_refuse_every_other_peer(tmp_path: Path, closed_url: str) -> None:
    """With ``serve.trusted_proxies`` only those peers reach the proxy (an IPv4-mapped IPv6
    address counts as its IPv4 one); anyone else gets a 403 saying why, health checks
    excepted."""
    settings = Settings(
        context_window_chars=B,
        store={"path": str(tmp_path / "gate.db")},
        serve={
            "upstream": closed_url,
            "identity": "headers",
            "host": "0.0.0.0",
            "trusted_proxies": ["10.0.0.0/8", "2001:db8::/32"],
        },
    )

    engine = MemoryEngine(settings)

    async def status(peer: str, path: str = "/v1/chat/completions") -> tuple[int, str]:
        app = create_app(settings, engine=engine)
        transport = httpx2.ASGITransport(app=app, client=(peer, 40_000))
        async with httpx2.AsyncClient(transport=transport, base_url="http://proxy") as http:
            if path == "/healthz":
                response = await http.get(path)
            else:  # a malformed body: a 400 once past the gate, before any upstream
                response = await http.post(path, content=b"[", headers={"X-Session-Id": "s"})
        return response.status_code, response.text

    with engine:
        assert 400 == asyncio.run(status("10.1.2.3"))[0]
        assert 400 == asyncio.run(status("::ffff:10.1.2.3"))[0]
        assert 400 == asyncio.run(status("2001:db8::7"))[0]
        refused, text = asyncio.run(status("192.0.2.7"))
        assert 403 == asyncio.run(status("127.0.0.1"))[0]
        assert 200 == asyncio.run(status("192.0.2.7", "/healthz"))[0]
    assert 403 == refused
    assert "this peer is not in serve.trusted_proxies" == json.loads(text)["error"]["message"]


# ---------------------------------------------------------------- the store and the CLI


@pytest.mark.both_backends
def test_the_scope_secret_is_made_once_and_audit_rows_read_by_scope(
    store_settings: StoreSettings,
) -> None:
    """The store's scope secret is random, made by its first opener and the same on every
    later open; ``compactions(scope=…)`` returns that scope's rows only."""
    with open_store(store_settings) as store:
        secret = store.scope_secret()
        mine, theirs = scope_of(secret, ALICE), scope_of(secret, MALLORY)
        for session in (f"{mine}:a-1", f"{theirs}:m-1", f"{mine}:a-2", "a-1", f"{mine}x:a"):
            store.audit(AuditRow(session_id=session, generation=1, status="failed"))
    with open_store(store_settings) as store:
        assert secret == store.scope_secret()
        found = [row["session_id"] for row in store.compactions(scope=mine)]
        only = store.compactions(f"{mine}:a-2", scope=mine)
    assert 32 == len(secret)
    assert [f"{mine}:a-1", f"{mine}:a-2"] == found
    assert [f"{mine}:a-2"] == [row["session_id"] for row in only]


def test_scope_and_audit_by_scope_through_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ragent-memory scope --key-env VAR`` prints the scope of the key the variable holds
    (the store's secret, or ``serve.secret_env``'s without touching a store); ``audit
    --scope`` lists that scope's rows; bad input is one line and exit 2."""
    db = tmp_path / "audit.db"
    with Store(db) as store:
        mine = scope_of(store.scope_secret(), ALICE)
        for session in (f"{mine}:a-1", "m-1", f"{mine}:a-2"):
            store.audit(AuditRow(session_id=session, generation=1, status="failed"))
    monkeypatch.setenv("ALICE_KEY", ALICE)
    printed = run_cli("scope", "--key-env", "ALICE_KEY", "--db", str(db))
    assert (0, mine) == (printed.returncode, printed.stdout.strip())
    listed = run_cli("audit", "--db", str(db), "--scope", mine, "--json")
    assert [f"{mine}:a-1", f"{mine}:a-2"] == [r["session_id"] for r in json.loads(listed.stdout)]
    for bad, fragment in (
        (["audit", "--db", str(db), "--scope", "alice"], "--scope 'alice': not a scope"),
        (
            ["scope", "--key-env", "RAGENT_TEST_UNSET", "--db", str(db)],
            "RAGENT_TEST_UNSET is not set",
        ),
        (["scope", "--db", str(db)], "--key-env"),
    ):
        done = run_cli(*bad)
        [line] = done.stderr.strip().splitlines()
        assert (2, True) == (done.returncode, line.startswith("error: ") and fragment in line)

    monkeypatch.setenv("RAGENT_TEST_SCOPE_SECRET", "s" * 32)
    config = tmp_path / "secret.yaml"
    store = {"path": str(tmp_path / "never.db")}
    config.write_text(
        json.dumps({"store": store, "serve": {"secret_env": "RAGENT_TEST_SCOPE_SECRET"}})
    )
    printed = run_cli("scope", "--key-env", "ALICE_KEY", "--config", str(config))
    assert scope_of(b"s" * 32, ALICE) == printed.stdout.strip()
    assert not (tmp_path / "never.db").exists()


def test_a_transcript_replayed_into_a_scope_is_that_keys_memory(
    tmp_path: Path, upstream: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The move docs/proxy.md describes: ``compact FILE --session SCOPE:s --user SCOPE:u``
    puts an old session into a key's scope; that key's next session recalls it, another
    key's does not."""
    config = write_config(tmp_path, "moved")
    transcript = tmp_path / "alice.json"
    transcript.write_text(json.dumps(alice_history(6)))
    with Store(tmp_path / "moved.db"):
        pass
    monkeypatch.setenv("ALICE_KEY", ALICE)
    scope = run_cli("scope", "--key-env", "ALICE_KEY", "--config", str(config)).stdout.strip()
    moved = run_cli(
        "compact",
        str(transcript),
        "--config",
        str(config),
        "--session",
        f"{scope}:a-1",
        "--user",
        f"{scope}:alice",
        "--out",
        str(tmp_path / "o.json"),
    )
    assert 0 == moved.returncode, moved.stderr
    question = [SYSTEM, {"role": "user", "content": QUESTION}]
    with ProxyProcess(config, upstream.base_url, cwd=tmp_path) as proxy:
        for key in (ALICE, MALLORY):
            ask(proxy, key, "later", "alice", question)
    assert "4417" in sent(upstream, ALICE)
    assert "4417" not in sent(upstream, MALLORY)


# ---------------------------------------------------------------- every wire format


def any_format_noted(body: Any) -> Answer:
    """ "Noted." in the format the request came in."""
    from wire_script import anthropic_reply, responses_reply, text_item

    if "input" in body:
        return responses_reply([text_item("Noted.")])
    if "max_tokens" in body:
        return anthropic_reply([{"type": "text", "text": "Noted."}])
    return Answer.reply("Noted.")


def ask_in(
    wire: str, proxy: ProxyProcess, key: str, history: list[dict[str, Any]], **ids: str
) -> None:
    """One request in ``wire``'s format through its real SDK; ``ids``: ``field`` (the body's
    user field: Anthropic ``metadata.user_id``, Responses ``user``) or ``session``/``user``
    headers."""
    import anthropic

    headers = {"X-Session-Id": ids["session"], "X-User-Id": ids["user"]} if "session" in ids else {}
    turns = history[1:]  # the system message goes top-level
    if wire == "messages":
        metadata = {"user_id": ids["field"]} if "field" in ids else {}
        with anthropic.Anthropic(
            base_url=proxy.root_url, api_key=key, default_headers=headers, max_retries=0
        ) as client:
            client.messages.create(
                model="m",
                max_tokens=64,
                system=SYSTEM["content"],
                messages=turns,
                metadata=metadata,  # type: ignore[arg-type]
            )
        return
    field = {"user": ids["field"]} if "field" in ids else {}
    with openai.OpenAI(
        base_url=proxy.base_url, api_key=key, default_headers=headers, max_retries=0
    ) as client:
        client.responses.create(model="m", instructions=SYSTEM["content"], input=turns, **field)  # type: ignore[arg-type]


@pytest.mark.parametrize("wire", ["messages", "responses"])
def test_every_format_is_scoped_by_the_callers_key(
    tmp_path: Path, upstream: FakeOpenAI, wire: str
) -> None:
    """Messages and Responses go through the same scoping as chat completions: Alice's
    session named only by her request's user field is stored under her key's scope, and
    Mallory's key claiming the same field (session and user) sends nothing of Alice's
    upstream, while Alice's own new session still gets the PIN back."""
    upstream.default = any_format_noted
    config = write_config(tmp_path, wire)
    db = tmp_path / f"{wire}.db"
    history = alice_history()
    with ProxyProcess(config, upstream.base_url, cwd=tmp_path) as first:
        for end in range(2, len(history) + 1, 2):
            ask_in(wire, first, ALICE, history[:end], field="alice")
        first.stop()
    scoped = rows(
        db, "SELECT DISTINCT ids.value FROM recall_messages JOIN ids ON ids.key = session_key"
    )
    assert [(f"{store_scope(db, ALICE)}:alice",)] == scoped

    upstream.reset()
    upstream.default = any_format_noted
    question = [SYSTEM, {"role": "user", "content": QUESTION}]
    with ProxyProcess(config, upstream.base_url, cwd=tmp_path) as second:
        ask_in(wire, second, MALLORY, question, field="alice")
        ask_in(wire, second, MALLORY, question, session="m-1", user="alice")
        ask_in(wire, second, ALICE, question, session="a-2", user="alice")
    by_key = {
        key: json.dumps([r.body for r in upstream.requests if key in json.dumps(r.headers)])
        for key in (ALICE, MALLORY)
    }
    assert "4417" in by_key[ALICE]
    assert "4417" not in by_key[MALLORY]
