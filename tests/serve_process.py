"""``ragent-memory serve`` as users run it: a real subprocess on 127.0.0.1, for tests and the
proxy benchmark.

    with ProxyProcess(config_path, upstream_url) as proxy:
        client = proxy.keep(openai.OpenAI(base_url=proxy.base_url, api_key=..., ...))

The server picks a free port (``--port 0``) and says which on its ready line; a reader thread
drains stderr (so the pipe never fills) and keeps every line for the tests to inspect. Every
wait is bounded; stopping sends SIGTERM (a graceful shutdown that flushes background work)
and kills the process if it does not exit in time. SDK clients handed to ``keep`` are closed
when the proxy stops: a client left to the garbage collector drops its sockets at a random
later moment, where ``ResourceWarning`` fails whichever test happens to be running.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

STARTUP_S = 60.0
SHUTDOWN_S = 30.0
Closable = TypeVar("Closable", bound=contextlib.AbstractContextManager[Any])
READY = re.compile(r"ragent-memory serve: (http://\S+/v1) ")


class ProxyProcess:
    """A running ``ragent-memory -v serve`` subprocess. See the module docstring."""

    def __init__(self, config: Path, upstream: str, *, cwd: Path, verbose: bool = True) -> None:
        args = [sys.executable, "-m", "ragent_memory", *(["-v"] if verbose else [])]
        args += ["serve", "--config", str(config), "--upstream", upstream, "--port", "0"]
        self.config = config
        self.lines: list[str] = []
        self.base_url = ""
        self._ready = threading.Event()
        self._clients = contextlib.ExitStack()
        self._process = subprocess.Popen(
            args,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(STARTUP_S) or not self.base_url:
            self.stop()
            raise RuntimeError(f"ragent-memory serve did not start:\n{self.log}")

    def _read(self) -> None:
        assert self._process.stderr is not None
        for line in self._process.stderr:
            self.lines.append(line)
            match = READY.search(line)
            if match and not self.base_url:
                self.base_url = match.group(1)
                self._ready.set()
        self._ready.set()  # the process ended (maybe before it was ready)

    @property
    def log(self) -> str:
        return "".join(self.lines)

    @property
    def root_url(self) -> str:
        return self.base_url.removesuffix("/v1")

    def keep(self, client: Closable) -> Closable:
        """``client`` (an SDK client, used as a context manager), closed when the proxy stops."""
        return self._clients.enter_context(client)

    def stop(self) -> int:
        """SIGTERM (uvicorn shuts down gracefully, then re-raises it), a bounded wait, then
        SIGKILL; the exit code. The kept clients are closed first."""
        self._clients.close()
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(SHUTDOWN_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(SHUTDOWN_S)
        self._reader.join(SHUTDOWN_S)
        if self._process.stderr is not None:
            self._process.stderr.close()
        return self._process.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash: no shutdown, no flush, leases and connections left as they are."""
        self._clients.close()
        self._process.kill()
        self._process.wait(SHUTDOWN_S)
        self._reader.join(SHUTDOWN_S)
        if self._process.stderr is not None:
            self._process.stderr.close()

    def __enter__(self) -> ProxyProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def write_config(
    directory: Path,
    name: str,
    *,
    budget: int,
    engine: dict[str, Any] | None = None,
    max_body_bytes: int = 4_194_304,
    **serve: Any,
) -> Path:
    """A YAML config (JSON is YAML) for a proxy of the tests: its store in ``directory``,
    ``identity: headers`` (the ids as sent; test_tenancy.py covers the default, by credential),
    ``serve`` keys on top."""
    config = directory / f"{name}.yaml"
    section = {"max_body_bytes": max_body_bytes, "timeout_s": 30, "identity": "headers", **serve}
    store = {"path": str(directory / f"{name}.db")}
    body = {**(engine or {}), "context_window_chars": budget, "store": store, "serve": section}
    config.write_text(json.dumps(body))
    return config
