"""The real Claude Code and Codex CLIs through ``ragent-memory serve`` (a subprocess) to a
scripted upstream on 127.0.0.1: 24 turns each with shell and file-read tool runs and calls of
the proxy's own tools, at B = 60,000 so the session is compacted. Each client's session runs
once per module; every test reads the same recording.

Set ``RAGENT_TEST_CAPTURE=DIR`` to keep every request body the upstream received in DIR.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from clients_drive import (
    SESSION_S,
    TURN_S,
    ClaudeSession,
    claude_env,
    codex_home,
    codex_turn,
    installed,
)
from clients_session import (
    INSTRUCTIONS,
    MIN_SHARE,
    PROMPT_MARKER,
    TURNS,
    Recorded,
    answered,
    applied_compactions,
    facts,
    harness_text,
    make_project,
    prompt,
    recording,
    shares,
    text_of,
    user_lines,
)
from clients_upstream import OUR_TOOLS, tool_names

KEY = "sk-test-clients-dummy-key"
CLIENT_TOOL = {"claude-code": "Bash", "codex": "exec_command"}


def run_claude_code(workdir: Path) -> Recorded:
    project = make_project(workdir / "project", "CLAUDE.md")
    home = workdir / "home"
    home.mkdir()
    with recording(workdir) as (_upstream, proxy, record):
        session = ClaudeSession(project, claude_env(home, proxy.root_url, KEY))
        deadline = time.monotonic() + SESSION_S
        try:
            for n in range(1, TURNS + 1):
                try:
                    left = max(0.1, min(TURN_S, deadline - time.monotonic()))
                    result = session.turn(prompt(n), left)
                except TimeoutError as err:
                    record.turns.append({"ok": False, "error": str(err)})
                    break
                record.turns.append(
                    {
                        "ok": result.get("subtype") == "success" and not result.get("is_error"),
                        "subtype": result.get("subtype"),
                        "result": str(result.get("result"))[:300],
                    }
                )
        finally:
            record.exit_code = session.close()
    return record


def run_codex(workdir: Path) -> Recorded:
    project = make_project(workdir / "project", "AGENTS.md")
    with recording(workdir) as (_upstream, proxy, record):
        home = codex_home(workdir / "codex-home", proxy.base_url)
        thread = None
        deadline = time.monotonic() + SESSION_S
        for n in range(1, TURNS + 1):
            timeout = max(0.1, min(TURN_S, deadline - time.monotonic()))
            try:
                done, thread = codex_turn(project, home, KEY, prompt(n), thread, timeout)
            except subprocess.TimeoutExpired as err:
                record.turns.append({"ok": False, "error": f"no exit in {err.timeout:.0f} s"})
                break
            kinds = [
                json.loads(line)["type"] for line in done.stdout.splitlines() if line[:1] == "{"
            ]
            failed = "turn.failed" in kinds or "error" in kinds
            record.turns.append(
                {
                    "ok": done.returncode == 0 and "turn.completed" in kinds and not failed,
                    "events": kinds,
                    "exit": done.returncode,
                    "stderr": done.stderr[-300:],
                    "stdout": done.stdout[-300:],
                }
            )
        record.exit_code = 0
    return record


def keep(record: Recorded, client: str) -> None:
    target = os.environ.get("RAGENT_TEST_CAPTURE")
    if not target:
        return
    folder = Path(target) / client
    folder.mkdir(parents=True, exist_ok=True)
    for number, received in enumerate(record.requests):
        item = {"path": received.path, "events": received.events, "body": received.body}
        (folder / f"upstream-{number:03d}.json").write_text(json.dumps(item, indent=1))
    (folder / "proxy.log").write_text(record.proxy_log)
    (folder / "turns.json").write_text(json.dumps(record.turns, indent=1))


@pytest.fixture(scope="module", params=["claude-code", "codex"])
def session(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Recorded]]:
    client = request.param
    assert installed(), "the client CLIs are missing: `make clients` installs them (make test does)"
    workdir = tmp_path_factory.mktemp(client)
    record = (run_claude_code if client == "claude-code" else run_codex)(workdir)
    keep(record, client)
    yield client, record


def test_every_turn_succeeds(session: tuple[str, Recorded]) -> None:
    """Each of the 24 turns ends in a success (Claude Code's result line, Codex's exit 0 with
    no failed turn) and the client exits 0."""
    _client, record = session
    failures = [f"turn {i + 1}: {t}" for i, t in enumerate(record.turns) if not t["ok"]]
    assert [] == failures
    assert TURNS == len(record.turns)
    assert 0 == record.exit_code


def test_session_is_compacted(session: tuple[str, Recorded]) -> None:
    """B = 60,000 over 24 tool-using turns compacts the conversation at least once."""
    _client, record = session
    assert len(applied_compactions(record.store)) >= 1, record.proxy_log[-3000:]


def test_instructions_and_first_prompt_survive_compaction(session: tuple[str, Recorded]) -> None:
    """After the first compaction every model request still carries the project instructions
    (CLAUDE.md / AGENTS.md whole, as written, not a summary's quote of their marker) and the
    user's first prompt (by its marker)."""
    client, record = session
    after = [r for r in record.main(CLIENT_TOOL[client]) if r.events[0] >= 1]
    assert after, "no model request came after a compaction"
    whole = json.dumps(INSTRUCTIONS, ensure_ascii=False)[1:-1]  # as it reads inside JSON
    missing = [
        (number, wanted[:40])
        for number, received in enumerate(after)
        for wanted in (whole, PROMPT_MARKER)
        if wanted not in text_of(received)
    ]
    assert [] == missing


def test_harness_text_is_never_the_users(session: tuple[str, Recorded]) -> None:
    """No fact learnt and no summary line given as the user's holds text the harness injected
    (system reminders, the skills list, CLAUDE.md / AGENTS.md, the environment block)."""
    _client, record = session
    learnt = [(fact, harness_text(fact)) for fact in facts(record.store) if harness_text(fact)]
    quoted = [
        (line, harness_text(line))
        for _session, _generation, summary in applied_compactions(record.store)
        for line in user_lines(summary)
        if harness_text(line)
    ]
    assert [] == learnt
    assert [] == quoted


def test_every_proxy_tool_call_is_answered(session: tuple[str, Recorded]) -> None:
    """The model calls ``search_memory`` (after text) and ``recall_tool_result`` (after text, on
    a ref the request shows); every such call is answered by the proxy: a later upstream
    request carries its result."""
    _client, record = session
    called = sorted({tool for _call, tool in record.our_calls})
    assert sorted(OUR_TOOLS) == called, "the proxy's tools were not offered (or no ref shown)"
    requests = [r for r in record.requests if isinstance(r.body, dict)]
    unanswered = [(call, tool) for call, tool in record.our_calls if not answered(call, requests)]
    assert [] == unanswered


def test_proxy_tools_are_offered_from_the_first_request(session: tuple[str, Recorded]) -> None:
    """The proxy adds the same tools to every model request of the session, the first one
    included (a tool list that changes mid-session breaks the prompt cache)."""
    client, record = session
    main = record.main(CLIENT_TOOL[client])
    assert main, "no model request reached the upstream"
    offered = [sorted(tool_names(r.body) & set(OUR_TOOLS)) for r in main]
    assert [sorted(OUR_TOOLS)] * len(main) == offered


def test_prompt_cache_prefix_holds(session: tuple[str, Recorded]) -> None:
    """Each model request's cached-prefix share against the one before is at least 0.95
    (requests right after a compaction or a trim event excepted): nothing the proxy inserts
    moves bytes that the previous request already sent."""
    client, record = session
    main = record.main(CLIENT_TOOL[client])
    assert len(main) >= TURNS, f"only {len(main)} model requests reached the upstream"
    low = [
        (i, round(share, 3), parted)
        for i, share, exempt, parted in shares(main)
        if not exempt and share < MIN_SHARE
    ]
    assert [] == low, "\n".join(map(repr, low))
    exempt = sum(1 for _, _, is_exempt, _ in shares(main) if is_exempt)
    assert len(main) - exempt >= 20, f"only {len(main) - exempt} requests checked"
