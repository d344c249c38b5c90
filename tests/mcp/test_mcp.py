"""``ragent-memory mcp`` as MCP clients run it: a real subprocess driven by the
official ``mcp`` SDK's own client, over stdio (and once over streamable HTTP), on a real SQLite
store filled through the public ``MemoryEngine`` API first (and once through the proxy)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import openai
import pytest
from fake_openai import FakeOpenAI
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult
from serve_process import ProxyProcess
from sessions import run_cli

from ragent_memory import MemoryEngine, Settings, StoreSettings
from ragent_memory.recall.refs import FOOTER_MARK, find_refs

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 60.0  # every client exchange, and the HTTP server's start, is bounded by this
B = 20_000
TOOLS = {"search_memory", "recall_tool_result", "list_facts", "forget_fact"}
FILLER = "The quarterly zebra report lists every depot and its stock. "
SAID = {
    "alice": ["I live in Porto.", "I'm a nurse.", "My cat is called Miso.", "I use vim."],
    "bob": ["I live in Oslo.", "I'm a plumber.", "Our project is called Falcon.", "I use emacs."],
    "carol": ["I live in Lisbon.", "I'm a pilot.", "I prefer tea.", "I live in Madrid now."],
}
NOTHING = "[search_memory: nothing found for this query]"


def talk(engine: MemoryEngine, user: str, lines: list[str], session: str) -> None:
    """One session of ``user`` saying ``lines``, each answered at length."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You help."}]
    for number, line in enumerate(lines):
        history.append({"role": "user", "content": line})
        engine.prepare(history, session_id=session, user_id=user)
        history.append({"role": "assistant", "content": f"Noted ({number}). " + FILLER * 12})
        engine.after_turn(history, session_id=session, user_id=user)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, list[str]]]]:
    """A store three users talked into, and each one's remembered facts as the engine says."""
    db = tmp_path_factory.mktemp("mcp") / "memory.db"
    settings = Settings(context_window_chars=B, store=StoreSettings(path=str(db)))
    with MemoryEngine(settings) as engine:
        for user, lines in SAID.items():
            talk(engine, user, lines, f"{user}-1")
        assert engine.flush(WAIT_S, extract_pending=True)
        facts = {user: [f.content for f in engine.memories(user)] for user in SAID}
    assert all(facts.values()), f"the offline extractor learnt nothing: {facts}"
    yield db, facts


def server(db: Path, user: str, *more: str, env: dict[str, str] | None = None) -> Any:
    args = ["-m", "ragent_memory", "mcp", "--db", str(db), "--user", user, *more]
    return StdioServerParameters(command=sys.executable, args=args, cwd=ROOT, env=env)


def session(target: Any, script: Callable[[Client], Awaitable[Any]]) -> Any:
    """Run ``script`` against a fresh client of ``target`` (stdio parameters or a URL); the
    server process (stdio) ends with the client. Bounded by ``WAIT_S``."""

    async def main() -> Any:
        with anyio.fail_after(WAIT_S):
            async with Client(target, mode="legacy", read_timeout_seconds=WAIT_S) as client:
                return await script(client)

    return anyio.run(main)


def text(result: CallToolResult) -> str:
    return "\n".join(str(getattr(part, "text", "")) for part in result.content)


def facts_of(result: CallToolResult) -> list[dict[str, Any]]:
    assert not result.is_error, text(result)
    assert isinstance(result.structured_content, dict)
    return list(result.structured_content["result"])


async def tour(client: Client, *, word: str, foreign: str) -> dict[str, Any]:
    """Every read tool once: the tools listed, the facts, a search for the user's own
    ``word`` and for another user's ``foreign`` one, and a recall of a ref the search named."""
    listed = await client.list_tools()
    found = await client.call_tool("search_memory", {"query": word, "limit": 3})
    # the ref named on the line that shows the hit (a neighbour cut short names its own)
    named = [find_refs(line) for line in text(found).splitlines() if word.split()[0] in line]
    refs = [ref for line_refs in named for ref in line_refs]
    assert refs, f"the search named no ref to recall on the hit's line:\n{text(found)}"
    whole = await client.call_tool("recall_tool_result", {"ref": refs[0]})
    page = await client.call_tool("recall_tool_result", {"ref": refs[0], "offset": 5, "limit": 7})
    return {
        "tools": {tool.name: tool for tool in listed.tools},
        "facts": facts_of(await client.call_tool("list_facts", {})),
        "found": found,
        "foreign": await client.call_tool("search_memory", {"query": foreign}),
        "ref": refs[0],
        "whole": whole,
        "page": page,
    }


def test_each_server_answers_for_its_own_user_only(store: tuple[Path, dict[str, list[str]]]):
    """Alice's and Bob's servers on one store: the four tools, each answering with that user's
    facts, excerpts and full texts; the other's words find nothing and the other's refs
    do not resolve."""
    db, facts = store
    alice = session(server(db, "alice"), lambda c: tour(c, word="Miso cat", foreign="Falcon"))
    bob = session(server(db, "bob"), lambda c: tour(c, word="Falcon project", foreign="Miso"))

    assert TOOLS == set(alice["tools"])
    search = alice["tools"]["search_memory"].input_schema
    assert (["query"], 20) == (search["required"], search["properties"]["limit"]["maximum"])
    assert ["ref"] == alice["tools"]["recall_tool_result"].input_schema["required"]
    assert alice["tools"]["forget_fact"].annotations.destructive_hint
    for me, other, seen in (("alice", "bob", alice), ("bob", "alice", bob)):
        assert facts[me] == [fact["content"] for fact in seen["facts"]]
        assert not set(facts[other]) & {fact["content"] for fact in seen["facts"]}
        assert not seen["found"].is_error and f"session {me}-1" in text(seen["found"])
        assert f"session {other}-1" not in text(seen["found"])
        assert NOTHING == text(seen["foreign"])
    assert "My cat is called Miso." in text(alice["found"])
    assert "Our project is called Falcon." in text(bob["found"])

    whole, page = text(alice["whole"]), text(alice["page"])
    original = whole.split(FOOTER_MARK)[0]
    assert "My cat is called Miso." == original  # the ref on the hit's line: its full text
    assert f"end of text, chars 0–{len(original)} of {len(original)}]" in whole
    assert page.startswith(original[5:12] + FOOTER_MARK + "chars 5–12 of ")

    def recall_alices(client: Client) -> Awaitable[CallToolResult]:
        return client.call_tool("recall_tool_result", {"ref": alice["ref"]})

    stolen = session(server(db, "bob"), recall_alices)
    assert stolen.is_error and "not found" in text(stolen)
    assert original not in text(stolen)


def test_forget_fact_erases_one_fact_of_this_user(store: tuple[Path, dict[str, list[str]]]):
    """Carol forgets one fact: it is gone from her list (and from a new engine's), the rest
    stay; forgetting it again, or Bob's fact from Carol's server, is a clear error that
    changes nothing."""
    db, facts = store

    async def forget(client: Client) -> dict[str, Any]:
        before = facts_of(await client.call_tool("list_facts", {}))
        victim = next(f for f in before if "pilot" in f["content"])
        bobs = bob_ids[0]  # an id of another user's fact, read from the store
        return {
            "before": before,
            "victim": victim,
            "forgot": await client.call_tool("forget_fact", {"id": victim["id"]}),
            "after": facts_of(await client.call_tool("list_facts", {})),
            "again": await client.call_tool("forget_fact", {"id": victim["id"]}),
            "bobs": await client.call_tool("forget_fact", {"id": bobs}),
        }

    with MemoryEngine(Settings(store=StoreSettings(path=str(db)))) as engine:
        bob_ids = [fact.id for fact in engine.memories("bob")]
    got = session(server(db, "carol"), forget)

    assert facts["carol"] == [fact["content"] for fact in got["before"]]
    assert (False, f"forgot fact {got['victim']['id']}") == (
        got["forgot"].is_error,
        text(got["forgot"]),
    )
    assert [f for f in got["before"] if f != got["victim"]] == got["after"]
    assert got["again"].is_error
    assert f"no fact {got['victim']['id']} is remembered about this user" in text(got["again"])
    assert got["bobs"].is_error and "see list_facts" in text(got["bobs"])
    with MemoryEngine(Settings(store=StoreSettings(path=str(db)))) as engine:
        assert [f["content"] for f in got["after"]] == [f.content for f in engine.memories("carol")]
        assert facts["bob"] == [f.content for f in engine.memories("bob")]
        assert bob_ids == [f.id for f in engine.memories("bob")]


BAD_CALLS = [
    ("search_memory", {}, "query\n  Field required"),
    ("search_memory", {"query": "   "}, "query is blank"),
    ("search_memory", {"query": "x", "limit": 0}, "greater than or equal to 1"),
    ("search_memory", {"query": "x", "limit": "lots"}, "limit\n  Input should be a valid int"),
    ("recall_tool_result", {"ref": "rm-0", "offset": -1}, "offset\n  Input should be greater"),
    ("recall_tool_result", {"ref": "rm-00000000000000000000"}, "not found"),
    ("forget_fact", {"id": "first"}, "id\n  Input should be a valid integer"),
    ("no_such_tool", {}, "no_such_tool"),
]


def test_bad_arguments_get_a_clear_error(store: tuple[Path, dict[str, list[str]]]):
    """Each bad call is an error result naming what is wrong; the server goes on answering
    and nothing changed."""
    db, facts = store

    async def calls(client: Client) -> tuple[list[CallToolResult], list[dict[str, Any]]]:
        bad = [await client.call_tool(tool, arguments) for tool, arguments, _ in BAD_CALLS]
        return bad, facts_of(await client.call_tool("list_facts", {}))

    results, after = session(server(db, "alice"), calls)
    for (tool, arguments, says), result in zip(BAD_CALLS, results, strict=True):
        assert result.is_error and says in text(result), (tool, arguments, text(result))
    assert facts["alice"] == [fact["content"] for fact in after]


@pytest.mark.both_backends
def test_forget_fact_takes_the_versions_it_replaced(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
):
    """The engine's ``forget_fact``: a fact that superseded another goes with the earlier
    version (nothing of it is kept), only for its own user, and the memory block drops it."""
    engine = make_engine(make_settings(context_window_chars=B))
    for user in ("carol", "dave"):  # Lisbon learnt first, then Madrid supersedes it
        talk(engine, user, SAID["carol"][:3], f"{user}-1")
        assert engine.flush(WAIT_S, extract_pending=True)
        talk(engine, user, SAID["carol"][3:], f"{user}-2")
        assert engine.flush(WAIT_S, extract_pending=True)
    [madrid] = [fact for fact in engine.memories("carol") if "Madrid" in fact.content]
    rows = engine.store.memory_rows("carol", kind="fact")
    assert [madrid.id] == [r["superseded_by"] for r in rows if "Lisbon" in r["content"]]
    daves = engine.store.memory_rows("dave", kind="fact")

    assert not engine.forget_fact("dave", madrid.id)
    assert engine.forget_fact("carol", madrid.id)
    assert not engine.forget_fact("carol", madrid.id)
    left = engine.store.memory_rows("carol", kind="fact")
    assert not [r for r in left if "Madrid" in r["content"] or "Lisbon" in r["content"]]
    assert len(rows) - 2 == len(left)
    assert daves == engine.store.memory_rows("dave", kind="fact")
    asked = [{"role": "user", "content": "Where do I live?"}]
    block = engine.prepare(asked, session_id="carol-3", user_id="carol").messages[0]["content"]
    assert "pilot" in block and "Madrid" not in block and "Lisbon" not in block
    with pytest.raises(ValueError, match="fact_id must be an integer"):
        engine.forget_fact("carol", "1")  # type: ignore[arg-type]


def test_command_line_errors_are_one_line(store: tuple[Path, dict[str, list[str]]], tmp_path):
    db, _ = store
    shadow = tmp_path / "no-extra" / "mcp"  # an `mcp` that cannot be imported: the extra's gone
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no mcp here', name='mcp')\n")
    cases = [
        (["--db", str(db)], "error: --user is required"),
        (["--db", str(tmp_path / "none.db"), "--user", "a"], f"no store at {tmp_path}"),
        (["--db", str(db), "--user", "a", "--http", "8090"], "expected HOST:PORT"),
        (["--db", str(db), "--user", "a", "--key-env", "RAGENT_TEST_UNSET"], "RAGENT_TEST_UNSET"),
        (["--db", str(db), "--user", "a", "--http", "0.0.0.0:0"], "needs a bearer token"),
        (["--db", str(db), "--user", "a", "--http", "[::]:0"], "--token-env"),
        (["--db", str(db), "--user", "a", "--token-env", TOKEN_ENV], "guards --http only"),
        (
            ["--db", str(db), "--user", "a", "--http", "127.0.0.1:0", "--token-env", "RAGENT_NO"],
            "--token-env: environment variable RAGENT_NO is not set",
        ),
    ]
    for args, says in cases:
        done = run_cli("mcp", *args, timeout_s=WAIT_S)
        assert (2, "") == (done.returncode, done.stdout), done.stderr
        assert says in done.stderr and 1 == len(done.stderr.strip().splitlines()), done.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "ragent_memory", "mcp", "--db", str(db), "--user", "a"],
        cwd=ROOT,
        env={"PYTHONPATH": str(shadow.parent), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert 2 == missing.returncode, missing.stderr
    assert "pip install 'ragent-memory[mcp]'" in missing.stderr


def test_key_env_finds_what_the_proxy_kept(upstream: FakeOpenAI, tmp_path: Path):
    """Alice talks through ``ragent-memory serve`` (serve.identity: credential) with her key;
    ``mcp --user alice --key-env VAR`` with that key in VAR finds her facts and excerpts, with
    another key or none it finds nothing of hers."""
    upstream.default = lambda body: "Noted."
    db, config = tmp_path / "proxy.db", tmp_path / "proxy.yaml"
    store = {"path": str(db)}
    config.write_text(json.dumps({"context_window_chars": B, "store": store}))
    history: list[dict[str, Any]] = []
    with ProxyProcess(config, upstream.base_url, cwd=tmp_path) as proxy:
        headers = {"X-Session-Id": "phone", "X-User-Id": "alice"}
        with openai.OpenAI(
            base_url=proxy.base_url, api_key="sk-alice-1", default_headers=headers, max_retries=0
        ) as chat:
            for line in SAID["alice"]:
                history.append({"role": "user", "content": line})
                reply = chat.chat.completions.create(model="m", messages=history, timeout=WAIT_S)
                history.append({"role": "assistant", "content": reply.choices[0].message.content})
        proxy.stop()  # a graceful stop runs every after_turn and flushes the memory work

    async def look(client: Client) -> tuple[list[dict[str, Any]], str]:
        facts = facts_of(await client.call_tool("list_facts", {}))
        return facts, text(await client.call_tool("search_memory", {"query": "Miso"}))

    key_env = ["--config", str(config), "--key-env", "RAGENT_TEST_KEY"]
    runs = {
        key: session(server(db, "alice", *key_env, env={"RAGENT_TEST_KEY": key}), look)
        for key in ("sk-alice-1", "sk-mallory-2")
    }
    plain = session(server(db, "alice", "--config", str(config)), look)
    facts, found = runs["sk-alice-1"]
    assert "Lives in Porto" in [fact["content"] for fact in facts]
    assert "My cat is called Miso." in found
    assert ([], NOTHING) == runs["sk-mallory-2"] == plain


READY = re.compile(r"ragent-memory mcp: (http://\S+/mcp) ")


TOKEN_ENV = "RAGENT_TEST_MCP_TOKEN"
TOKEN = "mcp-token-5b1e0c9a7d3f42e8"


@contextlib.contextmanager
def http_server(
    db: Path, user: str, where: str, *more: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, list[str], subprocess.Popen[str]]]:
    """``ragent-memory mcp --http where`` as a subprocess: the URL it says it serves, its
    stderr lines (read as they come) and the process; SIGTERM at the end, every wait bounded."""
    args = [sys.executable, "-m", "ragent_memory", "mcp", "--db", str(db), "--user", user]
    process = subprocess.Popen(
        [*args, "--http", where, *more],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            ready.set() if READY.search(line) else None
        ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(WAIT_S) and READY.search("".join(lines)), "".join(lines)
        yield READY.search("".join(lines)).group(1), lines, process  # type: ignore[union-attr]
    finally:
        process.terminate()
        try:
            process.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(WAIT_S)
        reader.join(WAIT_S)
        process.stderr.close()  # type: ignore[union-attr]


async def listed(client: Client) -> list[dict[str, Any]]:
    return facts_of(await client.call_tool("list_facts", {}))


def test_streamable_http(store: tuple[Path, dict[str, list[str]]]):
    """``--http 127.0.0.1:0``: the server says where it listens and warns that it takes no
    token, the SDK's client talks to it there, and SIGTERM ends it."""
    db, facts = store
    with http_server(db, "bob", "127.0.0.1:0") as (url, lines, process):
        assert facts["bob"] == [fact["content"] for fact in session(url, listed)]
    log = "".join(lines)
    assert -signal.SIGTERM == process.returncode, log  # uvicorn's graceful stop re-raises it
    assert "Traceback" not in log
    assert "mcp.http_without_token" in log and "--token-env" in log


@contextlib.asynccontextmanager
async def with_token(url: str, authorization: str | None) -> AsyncIterator[Any]:
    """The SDK's streamable HTTP transport to ``url``, sending ``authorization`` (if any)."""
    headers = {"Authorization": authorization} if authorization is not None else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=WAIT_S) as client,
        streamable_http_client(url, http_client=client) as streams,
    ):
        yield streams


def test_a_token_guards_the_http_server(store: tuple[Path, dict[str, list[str]]]):
    """``--http 0.0.0.0:0 --token-env VAR``: the SDK's client with the token gets the facts;
    without it, or with a wrong one, every request is a 401 and the client gets nothing."""
    db, facts = store
    env = {TOKEN_ENV: TOKEN}
    with http_server(db, "bob", "0.0.0.0:0", "--token-env", TOKEN_ENV, env=env) as (url, lines, _):
        url = url.replace("0.0.0.0", "127.0.0.1")
        got = session(with_token(url, f"Bearer {TOKEN}"), listed)
        assert facts["bob"] == [fact["content"] for fact in got]
        wrong = [None, f"Bearer {TOKEN[:-1]}X", f"Bearer {TOKEN}X", f"Basic {TOKEN}", "Bearer x"]
        for authorization in wrong:
            with pytest.raises(ExceptionGroup) as refused:
                session(with_token(url, authorization), listed)
            assert refused.group_contains(MCPError, depth=None), refused.value
            ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            headers = {"Accept": "application/json, text/event-stream"}
            headers |= {"Authorization": authorization} if authorization is not None else {}
            answer = httpx2.post(url, json=ping, headers=headers, timeout=WAIT_S)
            assert 401 == answer.status_code, answer.text
            assert "Bearer" in answer.headers["www-authenticate"]
            assert "--token-env" in answer.json()["error_description"]
    assert "mcp.http_without_token" not in "".join(lines)
    assert TOKEN not in "".join(lines)  # never logged


def test_the_documented_config_block_runs(store: tuple[Path, dict[str, list[str]]], tmp_path):
    """docs/mcp.md's Claude Desktop block, its example paths made real, starts a server the
    SDK's client gets Alice's facts from."""
    db, facts = store
    page = (ROOT / "docs" / "mcp.md").read_text(encoding="utf-8")
    block = re.search(r"## Claude Desktop.*?```json\n(.*?)```", page, re.S)
    assert block, "docs/mcp.md has no Claude Desktop config block"
    entry = json.loads(block.group(1))["mcpServers"]["ragent-memory"]
    config = tmp_path / "ragent-memory.yaml"
    config.write_text(json.dumps({"store": {"path": str(db)}}))
    home = "/home/you/ragent-memory"
    command = entry["command"].replace(f"{home}/.venv/bin", str(Path(sys.executable).parent))
    args = [arg.replace(f"{home}/config/ragent-memory.yaml", str(config)) for arg in entry["args"]]
    params = StdioServerParameters(command=command, args=args, env={"PYTHONPATH": str(ROOT)})

    async def listed(client: Client) -> list[dict[str, Any]]:
        return facts_of(await client.call_tool("list_facts", {}))

    assert facts["alice"] == [fact["content"] for fact in session(params, listed)]
