"""A scripted model upstream on 127.0.0.1 for the real Claude Code and Codex CLIs: it answers
Anthropic Messages (SSE or whole, plus ``count_tokens``) and OpenAI Responses (SSE or whole)
the way the providers do, and records every request it receives.

    with ClientUpstream(store_path) as upstream:
        ...  # ragent-memory serve --upstream upstream.base_url; the client at the proxy

What it answers is decided from the request alone (``plan``), so a test needs no queue:

- a conversation whose last item is a tool result gets a long text reply (the turn ends);
- a user prompt carrying ``TURN-<n>`` gets, by ``n``: a call of the client's shell tool, a
  file read (Claude Code's ``Read``; Codex reads with its shell), text then a call of the
  proxy's ``search_memory`` (text first: what real models do), text then
  ``recall_tool_result`` of a ref the request shows, or a long text reply (the proxy-tool
  calls ask for little, 2 excerpts or 1,000 characters, so no single call grows the prompt by
  more than a few per cent);
- anything else (a client's side request: a title, a quota probe) gets a short text.

Each recorded request also notes the store's compaction and substitution counts at the moment
it arrived (read from the proxy's SQLite file), so a test can tell which requests came right
after a compaction or a trim event.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import sqlite3
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from clients_drive import serialised_prompt
from fake_openai import LoopbackServer
from wire_script import (
    anthropic_events,
    call_item,
    message,
    response,
    responses_events,
    text_item,
)

from ragent_memory.recall.refs import REF_PATTERN

OUR_TOOLS = ("search_memory", "recall_tool_result")
TURN = re.compile(r"\bTURN-(\d+)\b")
PARAGRAPH = (
    "Step {n}.{k}: the build log for this part of the task was read end to end; the module "
    "layout, the failing assertion and the fixture it depends on all line up with what the "
    "earlier runs showed, so the next change stays small and is checked by one test run. "
)


@dataclass(frozen=True)
class Step:
    """One thing a scripted reply does: ``text``, or a tool call (``tool`` with ``arguments``)."""

    text: str = ""
    tool: str = ""
    arguments: dict[str, Any] | None = None


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any  # parsed JSON, or None
    # (applied compactions, placeholders and previews, recall blocks taken off so far) in the
    # store on arrival
    events: tuple[int, int, int]


def long_text(n: int, size: int) -> str:
    """A report of about ``size`` characters (whole paragraphs, at least two)."""
    paragraphs = max(2, round(size / len(PARAGRAPH)))
    return f"Turn {n} report. " + "".join(PARAGRAPH.format(n=n, k=k) for k in range(paragraphs))


def store_events(path: Path) -> tuple[int, int, frozenset[tuple[bytes, str]]]:
    """The store's applied compactions, its placeholders and previews, and the recall blocks
    kept on their messages ((0, 0, none) before it exists). A kept block is no event; one
    taken off its message is (the recorder counts those that disappear)."""
    if not path.exists():
        return (0, 0, frozenset())
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as db:
        try:
            applied = db.execute("SELECT count(*) FROM compactions WHERE status = 'applied'")
            substituted = db.execute("SELECT count(*) FROM substitutions WHERE kind != 'recall'")
            counts = (applied.fetchone()[0], substituted.fetchone()[0])
            kept = db.execute("SELECT session_key, key FROM substitutions WHERE kind = 'recall'")
            return (*counts, frozenset((bytes(k), str(p)) for k, p in kept.fetchall()))
        except sqlite3.OperationalError:  # not migrated yet
            return (0, 0, frozenset())


# ---------------------------------------------------------------------- reading a request


def tool_names(body: dict[str, Any]) -> set[str]:
    """The tools a request offers (Anthropic ``name``; Responses ``name``, or the type of a
    built-in tool)."""
    return {str(t.get("name") or t.get("type")) for t in body.get("tools") or []}


def anthropic_last(body: dict[str, Any]) -> tuple[str, bool]:
    """The latest user turn's text and whether it ends with a tool result (system turns
    after it, which Claude Code sends mid-conversation, are passed over)."""
    turns = [m for m in body.get("messages") or [] if m.get("role") != "system"]
    if not turns or turns[-1].get("role") != "user":
        return "", False
    content = turns[-1].get("content")
    if isinstance(content, str):
        return content, False
    blocks = [b for b in content if isinstance(b, dict)]
    text = " ".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    return text, any(b.get("type") == "tool_result" for b in blocks)


def responses_last(body: dict[str, Any]) -> tuple[str, bool]:
    """The latest input item's text (a user message) and whether it is a tool output."""
    items = body.get("input")
    if isinstance(items, str):
        return items, False
    if not items:
        return "", False
    last = items[-1]
    if str(last.get("type", "")).endswith("_output"):
        return "", True
    if last.get("role") != "user":
        return "", False
    content = last.get("content")
    if isinstance(content, str):
        return content, False
    return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict)), False


def plan(body: dict[str, Any], *, shell: str, read: str | None, share: float) -> list[Step]:
    """What to answer a main request (one offering the client's tool ``shell``). A text reply
    is ``share`` of the request's prompt long, so a conversation grows by about that share a
    turn whatever the client's own prompt weighs."""
    text, after_tool = (anthropic_last if "messages" in body else responses_last)(body)
    found = TURN.findall(text if not after_tool else json.dumps(body))
    n = int(found[-1]) if found else 0
    reply = Step(text=long_text(n, int(share * len(serialised_prompt(body)))))
    if after_tool or not TURN.search(text):
        return [reply]
    offered = tool_names(body)
    refs = REF_PATTERN.findall(json.dumps(body))
    lead = Step(text=f"Let me check what I have on turn {n} first.")
    match n % 6:
        case 1:
            return [Step(tool=shell, arguments={"command": f"echo shell-{n}-ok && ls"})]
        case 2 if read:
            return [Step(tool=read, arguments={"path": "notes.txt"})]
        case 2:
            return [Step(tool=shell, arguments={"command": "cat notes.txt"})]
        case 3 if "search_memory" in offered:
            search = {"query": "build log fixture", "limit": 2}
            return [lead, Step(tool="search_memory", arguments=search)]
        case 4 if "recall_tool_result" in offered and refs:
            recall = {"ref": refs[-1], "limit": 1_000}
            return [lead, Step(tool="recall_tool_result", arguments=recall)]
    return [reply]


# ---------------------------------------------------------------------- writing a reply


class ClientUpstream(LoopbackServer):
    """The scripted upstream. See the module docstring."""

    def __init__(self, store: Path, *, share: float = 0.03, workdir: Path | None = None) -> None:
        self.store = store
        self.share = share
        self.workdir = workdir
        self.requests: list[Received] = []
        self.our_calls: list[tuple[str, str]] = []  # (id, tool) of each proxy-tool call made
        self._lock = threading.Lock()
        self._blocks: frozenset[tuple[bytes, str]] = frozenset()  # recall blocks kept now
        self._blocks_off = 0  # recall blocks taken off their messages so far
        self._ids = itertools.count(1)
        super().__init__(_handler_for(self))

    def bodies(self, route: str) -> list[dict[str, Any]]:
        """The JSON bodies received on ``route`` (query string ignored), in order."""
        return [r.body for r in self.received(route)]

    def received(self, route: str) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if r.path.split("?", 1)[0] == route]

    # ---- serving (handler threads)
    def respond(self, handler: BaseHTTPRequestHandler) -> None:
        data = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        try:
            body = json.loads(data)
        except ValueError:
            body = None
        headers = {name.lower(): value for name, value in handler.headers.items()}
        with self._lock:
            applied, substituted, kept = store_events(self.store)
            self._blocks_off += len(self._blocks - kept)
            self._blocks = kept
            events = (applied, substituted, self._blocks_off)
            self.requests.append(Received(handler.path, headers, body, events))
        route = handler.path.split("?", 1)[0]
        if not isinstance(body, dict):
            send_json(handler, 400, {"error": {"message": "body is not a JSON object"}})
        elif route == "/v1/messages/count_tokens":
            send_json(handler, 200, {"input_tokens": len(json.dumps(body)) // 4})
        elif route == "/v1/messages":
            self._anthropic(handler, body)
        elif route == "/v1/responses":
            self._responses(handler, body)
        else:
            send_json(handler, 404, {"error": {"message": f"no route {route}"}})

    def _steps(self, body: dict[str, Any], shell: str, read: str | None) -> list[Step]:
        if shell not in tool_names(body):
            return [Step(text="Noted.")]  # a side request: title, quota probe, topic check
        return plan(body, shell=shell, read=read, share=self.share)

    def _call_id(self, prefix: str, step: Step) -> str:
        call_id = f"{prefix}_{next(self._ids):04d}"
        if step.tool in OUR_TOOLS:
            with self._lock:
                self.our_calls.append((call_id, step.tool))
        return call_id

    def _anthropic(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        blocks: list[dict[str, Any]] = []
        for step in self._steps(body, "Bash", "Read"):
            if not step.tool:
                blocks.append({"type": "text", "text": step.text})
                continue
            arguments = dict(step.arguments or {})
            if step.tool == "Read":
                arguments = {"file_path": str((self.workdir or Path()) / arguments["path"])}
            elif step.tool == "Bash":
                arguments["description"] = "Run the step's command"
            call_id = self._call_id("toolu", step)
            blocks.append(
                {"type": "tool_use", "id": call_id, "name": step.tool, "input": arguments}
            )
        # a fresh message id per reply: Claude Code merges the blocks of one id into one turn
        unique = f"msg_{next(self._ids):06d}"
        if body.get("stream"):
            events = [
                e.replace(b'"msg_fake"', f'"{unique}"'.encode()) for e in anthropic_events(blocks)
            ]
            send_events(handler, events)
        else:
            send_json(handler, 200, {**message(blocks), "id": unique})

    def _responses(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        shell = next(
            (n for n in ("shell_command", "shell", "exec_command") if n in tool_names(body)),
            "shell",
        )
        output: list[dict[str, Any]] = []
        for step in self._steps(body, shell, None):
            number = next(self._ids)
            if not step.tool:
                output.append(text_item(step.text, f"msg_{number:04d}"))
                continue
            arguments = codex_arguments(step, shell)
            call_id = self._call_id("call", step)
            output.append(call_item(call_id, step.tool, json.dumps(arguments), f"fc_{number:04d}"))
        unique = f"resp_{next(self._ids):06d}"
        if body.get("stream"):
            events = [
                e.replace(b'"resp_fake"', f'"{unique}"'.encode()) for e in responses_events(output)
            ]
            send_events(handler, events)
        else:
            send_json(handler, 200, {**response(output), "id": unique})


def codex_arguments(step: Step, shell: str) -> dict[str, Any]:
    """A shell step's arguments in the shape of the shell tool Codex offered."""
    arguments = dict(step.arguments or {})
    if step.tool != shell:
        return arguments
    command = arguments["command"]
    if shell == "shell":
        return {"command": ["bash", "-lc", command], "timeout_ms": 20_000}
    if shell == "exec_command":
        return {"cmd": command}
    return {"command": command, "timeout_ms": 20_000}


def send_json(handler: BaseHTTPRequestHandler, status: int, payload: Any) -> None:
    content = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(content)))
    handler.end_headers()
    handler.wfile.write(content)


def send_events(handler: BaseHTTPRequestHandler, events: list[bytes]) -> None:
    """An SSE stream, each event flushed on its own; the connection closes at the end."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Cache-Control", "no-cache")
    handler.end_headers()
    for event in events:
        handler.wfile.write(event)
        handler.wfile.flush()


def _handler_for(server: ClientUpstream) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                server.respond(self)

        def do_GET(self) -> None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                with server._lock:
                    server.requests.append(Received(self.path, {}, None, (0, 0)))
                send_json(self, 404, {"error": {"message": f"no route {self.path}"}})

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
