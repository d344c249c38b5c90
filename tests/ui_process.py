"""`ragent-memory ui` as a real subprocess for tests, and the demo store it is started over."""

from __future__ import annotations

import os
import queue
import sqlite3
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from sessions import ROOT, run_cli

from ragent_memory import MemoryEngine, Settings, StoreSettings

READY_S = 60.0
SCOPE_A = "a" * 24
SCOPE_B = "b" * 24
HOSTILE = "<script>document.title='pwned'</script> order ZX-1 <b>bold</b>"


class UiProcess:
    """``python -m ragent_memory ui ARGS --port 0``; ``url`` once it listens."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ragent_memory", "ui", "--port", "0", *args],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.ready_line = self._wait_ready()
        self.shown = self.ready_line.removeprefix("ragent-memory ui: ").split()[0]
        self.url = "/".join(self.shown.split("/")[:3])  # scheme://host:port

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)

    def _wait_ready(self) -> str:
        seen = []
        while True:
            try:
                line = self.lines.get(timeout=READY_S)
            except queue.Empty:
                self.stop()
                raise AssertionError(f"ui not ready in {READY_S} s: {''.join(seen)}") from None
            seen.append(line)
            if line.startswith("ragent-memory ui: "):
                return line.strip()

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        """Status and body of GET ``path`` (redirects not followed)."""
        return self.request("GET", path, headers=headers)

    def request(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
    ) -> tuple[int, str]:
        request = urllib.request.Request(
            self.url + path, method=method, headers=headers or {}, data=data
        )
        opener = urllib.request.build_opener(_NoRedirect())
        try:
            with opener.open(request, timeout=60) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def stop(self) -> int:
        """Terminate it (kill after 30 s) and close its pipe; its exit code."""
        self.proc.terminate()
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=30)
        self._reader.join(timeout=30)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code

    def __enter__(self) -> UiProcess:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None


def demo_store(folder: Path) -> Path:
    """A store the demo wrote (120 turns, two generations), plus one session in each of two
    proxy scopes, one of them holding markup in a user message."""
    db = folder / "demo.db"
    result = run_cli("demo", "--turns", "120", "--out", str(folder), "--db", str(db))
    assert 0 == result.returncode, result.stderr
    (folder / "demo-stdout.txt").write_text(result.stdout, encoding="utf-8")
    engine = MemoryEngine(Settings(context_window_chars=60_000, store=StoreSettings(path=str(db))))
    with engine:
        for scope, name in ((SCOPE_A, "alpha"), (SCOPE_B, "beta")):
            history = [{"role": "user", "content": f"{HOSTILE} from {name}"}]
            engine.prepare(history, session_id=f"{scope}:{name}", user_id=f"{scope}:u")
            engine.after_turn(history, session_id=f"{scope}:{name}", user_id=f"{scope}:u")
        assert engine.flush(timeout_s=60)
    return db


def copy_store(source: Path, target: Path) -> Path:
    """A copy of a SQLite store (the backup API: committed pages, WAL included)."""
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    src.close()
    dst.close()
    return target
