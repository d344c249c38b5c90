"""Driving the real Claude Code and Codex CLIs (installed by ``make clients`` into
``clients/node_modules``) offline, and the measures the client tests assert on.

Both run with a temporary home, a dummy key and every update check, telemetry and error report
switched off, so the only traffic is to the proxy on 127.0.0.1:

- Claude Code: print mode reading user turns as stream-json on stdin (one process, one
  conversation, a ``result`` line per turn), its default model, ``Bash`` and ``Read`` allowed
  without asking.
- Codex: ``codex exec`` for the first turn, ``codex exec resume <thread>`` for each later one,
  with a model provider declared in ``$CODEX_HOME/config.toml`` (``wire_api = "responses"``),
  no sandbox and no approvals (the test owns the directory it runs in).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "clients" / "node_modules" / ".bin"
CLAUDE = BIN / "claude"
CODEX = BIN / "codex"
TURN_S = 90.0  # one client turn, proxy and upstream included, on a loaded machine
SESSION_S = 200.0  # a whole 24-turn session (about 15 s unloaded)
# No traffic leaves the machine: anything not for 127.0.0.1 goes to a closed local port.
NOWHERE = "http://127.0.0.1:9"
CODEX_MODEL = "gpt-5.2-codex"  # a model whose shell tool Codex offers as a plain function
OFFLINE = {
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
}


def base_env(home: Path) -> dict[str, str]:
    """A clean environment: PATH, a temporary HOME, nothing of the caller's (no real key), and
    every proxy variable at a closed port on 127.0.0.1 so a request for anywhere else fails
    at once instead of leaving the machine."""
    path = os.pathsep.join(p for p in ("/usr/local/bin", "/usr/bin", "/bin") if Path(p).is_dir())
    proxies = {name: NOWHERE for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")}
    return {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8", **proxies, "NO_PROXY": "127.0.0.1"}


# ---------------------------------------------------------------------- Claude Code


def claude_env(home: Path, proxy_root: str, key: str) -> dict[str, str]:
    return {
        **base_env(home),
        **OFFLINE,
        "ANTHROPIC_BASE_URL": proxy_root,
        "ANTHROPIC_API_KEY": key,
    }


class ClaudeSession:
    """One Claude Code conversation in print mode, a user turn at a time over stream-json.

    ``turn(text)`` writes the user message and waits (at most ``TURN_S``) for the ``result``
    line; a reader thread drains stdout into a queue so no wait can hang."""

    def __init__(self, project: Path, env: dict[str, str]) -> None:
        args = [str(CLAUDE), "-p", "--input-format", "stream-json", "--output-format"]
        args += ["stream-json", "--verbose", "--allowedTools", "Bash", "Read"]
        self._process = subprocess.Popen(
            args,
            cwd=project,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.stderr = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._errors = threading.Thread(target=self._read_errors, daemon=True)
        self._errors.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _read_errors(self) -> None:
        assert self._process.stderr is not None
        self.stderr = self._process.stderr.read()

    def turn(self, text: str, timeout: float = TURN_S) -> dict[str, Any]:
        """The turn's ``result`` message (``subtype`` ``success`` and ``is_error`` false when it
        went through); ``TimeoutError`` after ``timeout`` seconds."""
        assert self._process.stdin is not None
        message = {"type": "user", "message": {"role": "user", "content": text}}
        self._process.stdin.write(json.dumps(message) + "\n")
        self._process.stdin.flush()
        end = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"claude gave no result in {timeout:.0f} s") from None
            if line is None:
                raise RuntimeError(f"claude exited mid-turn:\n{self.stderr}")
            event = json.loads(line)
            if event.get("type") == "result":
                return event

    def close(self) -> int:
        """End of input, then the exit code (killed if it does not exit in time)."""
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        try:
            return self._process.wait(TURN_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            return self._process.wait(TURN_S)
        finally:
            self._reader.join(TURN_S)
            self._errors.join(TURN_S)
            for pipe in (self._process.stdout, self._process.stderr):
                if pipe is not None:
                    pipe.close()


# ---------------------------------------------------------------------- Codex


def codex_home(directory: Path, proxy_url: str) -> Path:
    """A CODEX_HOME whose config points a ``responses`` provider at the proxy."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.toml").write_text(
        f'model = "{CODEX_MODEL}"\n'
        'model_provider = "ragent"\n'
        "check_for_update_on_startup = false\n\n"
        "[model_providers.ragent]\n"
        'name = "ragent-memory serve"\n'
        f'base_url = "{proxy_url}"\n'
        'env_key = "RAGENT_TEST_OPENAI_KEY"\n'
        'wire_api = "responses"\n\n'
        "[analytics]\nenabled = false\n\n"
        '[otel]\nexporter = "none"\n'
    )
    return directory


def codex_turn(
    project: Path, home: Path, key: str, text: str, thread: str | None, timeout: float = TURN_S
) -> tuple[subprocess.CompletedProcess[str], str | None]:
    """One ``codex exec`` (or ``exec resume THREAD``) turn: the finished process and the thread
    id it reported (``subprocess.TimeoutExpired`` after ``timeout`` seconds)."""
    env = {**base_env(home), "CODEX_HOME": str(home), "RAGENT_TEST_OPENAI_KEY": key}
    flags = ["--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
    args = [str(CODEX), "exec", *(["resume", thread] if thread else []), *flags, text]
    done = subprocess.run(
        args,
        cwd=project,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    for line in done.stdout.splitlines():
        if line.startswith("{") and '"thread.started"' in line:
            thread = json.loads(line)["thread_id"]
    return done, thread


def installed() -> bool:
    return CLAUDE.exists() and CODEX.exists() and shutil.which("git") is not None


# ---------------------------------------------------------------------- measures


def _as_cached(value: Any) -> Any:
    """``value`` as the provider's cache reads it: ``cache_control`` marks left out, and a
    turn's string ``content`` written as the one text block it stands for."""
    if isinstance(value, list):
        return [_as_cached(v) for v in value]
    if not isinstance(value, dict):
        return value
    found = {k: _as_cached(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(found.get("content"), str) and "role" in found:
        found["content"] = [{"type": "text", "text": found["content"]}]
    return found


def serialised_prompt(body: dict[str, Any]) -> str:
    """A request's prompt in the order a provider's prompt cache reads it: tools, then the
    system prompt (``system`` / ``instructions``), then the conversation (``messages`` /
    ``input``), as compact JSON. Two things that are not prompt text are normalised: the
    ``cache_control`` marks (they say where a cache entry ends; Claude Code moves its last one
    every turn) and a turn's string ``content``, which the Messages API reads as one text block
    (Claude Code sends its latest turn as blocks and the same turn later as a string)."""
    turns = body.get("messages") if "messages" in body else body.get("input")
    system = body.get("system") if "messages" in body else body.get("instructions")
    parts = [body.get("tools"), system, turns]
    return json.dumps(_as_cached(parts), ensure_ascii=False, separators=(",", ":"))


def cached_prefix_share(previous: dict[str, Any], current: dict[str, Any]) -> float:
    """Per-call cached-prefix share: the fraction of ``previous``'s serialised prompt that
    ``current`` repeats byte for byte as its prefix, i.e. how much of what the last call
    paid for a provider's prompt cache can serve again. A call that changes nothing of
    ``previous`` and appends its new turns scores 1 (what it appends is new to any cache);
    a change early in the prompt scores low."""
    # Without the two closing brackets (of the turns and of the prompt), which a call that
    # appends turns replaces by a comma.
    before, now = serialised_prompt(previous)[:-2], serialised_prompt(current)
    return common_prefix_len(before, now) / len(before) if before else 1.0


def common_prefix_len(a: str, b: str) -> int:
    """How many leading characters ``a`` and ``b`` share (a binary search over slices)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low
