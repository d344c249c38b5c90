"""A recorded client session through ``ragent-memory serve``: the real CLI, the proxy as a
subprocess, the scripted upstream; then what the tests read back (upstream requests, the
store's compactions, facts and summaries).

The project directory holds an instruction file (CLAUDE.md or AGENTS.md) carrying
``INSTRUCTIONS_MARKER``; the first prompt carries ``PROMPT_MARKER``. The instruction file also
holds two imperative sentences a naive fact extractor would take for the user's standing
requests (``HARNESS_PHRASES``).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clients_drive import cached_prefix_share, common_prefix_len, serialised_prompt
from clients_upstream import ClientUpstream, Received, tool_names
from serve_process import ProxyProcess, write_config

B = 60_000  # compacts both clients' sessions by about turn 18 of 24
TURNS = 24
INSTRUCTIONS_MARKER = "MARKER-INSTRUCTIONS-7Q2X"
PROMPT_MARKER = "MARKER-FIRSTPROMPT-9ZK4"
INSTRUCTIONS = (
    f"# Project rules ({INSTRUCTIONS_MARKER})\n"
    "Always answer in British English.\n"
    "Never run rm without asking first.\n"
)
# Text only the harness put in the conversation: never a fact about the user, never a (user) line
HARNESS_PHRASES = (
    INSTRUCTIONS_MARKER,
    "British English",
    "without asking first",
    "system-reminder",
    "CLAUDE.md",
    "AGENTS.md",
    "environment_context",
    "INSTRUCTIONS>",
    "skill",
    "gitStatus",
)
NOTES = "".join(f"note {i}: the parser keeps token {i * 13} in its table.\n" for i in range(20))
MIN_SHARE = 0.95


def prompt(n: int) -> str:
    if n == 1:
        return f"TURN-1 {PROMPT_MARKER}: start the parser refactor; notes.txt has the plan."
    return f"TURN-{n}: carry on with step {n} of the parser refactor."


def make_project(directory: Path, instructions_file: str) -> Path:
    directory.mkdir(parents=True)
    (directory / instructions_file).write_text(INSTRUCTIONS)
    (directory / "notes.txt").write_text(NOTES)
    subprocess.run(["git", "init", "-q"], cwd=directory, check=True, timeout=30)
    return directory


def proxy_config(directory: Path) -> Path:
    """B = 60,000 chars; identity by credential (the default a user gets); no model for
    summaries, so the offline summarizer and fact extractor run."""
    return write_config(directory, "proxy", budget=B, identity="credential")


@dataclass
class Recorded:
    """What one client session left behind."""

    turns: list[dict[str, Any]] = field(default_factory=list)  # per turn: exit code, details
    requests: list[Received] = field(default_factory=list)
    our_calls: list[tuple[str, str]] = field(default_factory=list)  # (call id, tool)
    proxy_log: str = ""
    exit_code: int | None = None
    store: Path = Path()

    def main(self, client_tool: str) -> list[Received]:
        """The conversation's model requests (those offering the client's own tool), in order."""
        return [
            r
            for r in self.requests
            if isinstance(r.body, dict) and client_tool in tool_names(r.body)
        ]


@contextlib.contextmanager
def recording(workdir: Path) -> Iterator[tuple[ClientUpstream, ProxyProcess, Recorded]]:
    """The upstream and the proxy running; on exit the proxy is stopped (its background work
    flushed) and everything is copied into the ``Recorded``."""
    config = proxy_config(workdir)
    record = Recorded(store=workdir / "proxy.db")
    with ClientUpstream(record.store, workdir=workdir / "project") as upstream:
        proxy = ProxyProcess(config, upstream.base_url, cwd=workdir)
        try:
            yield upstream, proxy, record
        finally:
            proxy.stop()
            record.proxy_log = proxy.log
            record.requests = list(upstream.requests)
            record.our_calls = list(upstream.our_calls)


# ---------------------------------------------------------------------- the store


def rows(store: Path, sql: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30)) as db:
        return db.execute(sql).fetchall()


def applied_compactions(store: Path) -> list[tuple[str, int, str]]:
    """(session, generation, summary) of every applied compaction."""
    sql = "SELECT session_id, generation, summary FROM compactions WHERE status = 'applied'"
    return [(r[0], r[1], r[2] or "") for r in rows(store, sql)]


def facts(store: Path) -> list[str]:
    return [r[0] for r in rows(store, "SELECT content FROM memories WHERE kind = 'fact'")]


def user_lines(summary: str) -> list[str]:
    """The summary's lines attributed to the user: ``(user)`` lines and every line of the
    "User requests" section (the user's own words)."""
    found, in_requests = [], False
    for line in summary.splitlines():
        if line.startswith("#"):
            in_requests = "user request" in line.lower()
            continue
        if in_requests or "(user)" in line:
            found.append(line)
    return found


def harness_text(text: str) -> list[str]:
    return [p for p in HARNESS_PHRASES if p.lower() in text.lower()]


# ---------------------------------------------------------------------- the wire


def text_of(received: Received) -> str:
    return json.dumps(received.body, ensure_ascii=False)


def answered(call_id: str, later: list[Received]) -> bool:
    """A later request carries the result of ``call_id`` (an Anthropic ``tool_result`` or a
    Responses ``function_call_output``)."""
    for received in later:
        body = received.body if isinstance(received.body, dict) else {}
        for turn in body.get("messages") or []:
            blocks = turn.get("content") if isinstance(turn.get("content"), list) else []
            if any(b.get("tool_use_id") == call_id for b in blocks if isinstance(b, dict)):
                return True
        for item in body.get("input") or []:
            output = isinstance(item, dict) and str(item.get("type", "")).endswith("_output")
            if output and item.get("call_id") == call_id:
                return True
    return False


def shares(main: list[Received]) -> list[tuple[int, float, bool, str]]:
    """(request index, cached-prefix share against the request before, exempt, what the
    previous prompt held where the two part) for every main request after the first. A
    request is exempt when the store's applied compactions, placeholders and previews, or
    recall blocks taken off their messages changed between the two requests before it and
    itself: a compaction or a trim event may move bytes, and when its commit lands relative
    to the proxy's ``prepare`` is not visible from outside, so the one request after that is
    exempt too. A recall block kept on its message is no event."""
    found = []
    for i in range(1, len(main)):
        share = cached_prefix_share(main[i - 1].body, main[i].body)
        window = {main[j].events for j in range(max(0, i - 2), i + 1)}
        before, now = serialised_prompt(main[i - 1].body), serialised_prompt(main[i].body)
        at = common_prefix_len(before, now)
        found.append((i, share, len(window) > 1, before[at : at + 80]))
    return found
