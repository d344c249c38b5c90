"""Compaction leases that survive their holder: a lease names its holder and is renewed while
the work runs; a holder that is gone loses it at once; a queued compaction holds none; a proxy
killed mid-compaction and restarted compacts again within a few turns."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
from conftest import PASSWORD_ENV
from fake_openai import FakeOpenAI
from serve_process import ProxyProcess
from sessions import without_recall

from ragent_memory import MemoryEngine, Settings, StoreSettings
from ragent_memory.store import Backend, Store, open_store, utc_now
from ragent_memory.store.base import id_key
from ragent_memory.store.hosts import Holder
from ragent_memory.summary.offline import OfflineSummarizer
from ragent_memory.summary.summarize import SummaryOutcome, SummaryRequest

WAIT_S = 60.0


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(utc_now())


@pytest.fixture(params=["sqlite", "postgres"])
def open_(
    request: pytest.FixtureRequest, tmp_path: Path, clock: Clock
) -> Iterator[Callable[..., Backend]]:
    """Opens stores (hosts) on one database, each closed at the end."""
    if request.param == "sqlite":
        settings = StoreSettings(path=str(tmp_path / "m.db"))
    else:
        settings = StoreSettings(url=request.getfixturevalue("pg_url"), password_env=PASSWORD_ENV)
    opened: list[Backend] = []

    def open_store_(**overrides: Any) -> Backend:
        store = open_store(attrs.evolve(settings, **overrides), clock=clock)
        opened.append(store)
        return store

    yield open_store_
    for store in opened:
        store.close()


def dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(WAIT_S)
    return child.pid


def test_a_lease_held_by_a_dead_process_on_this_machine_is_taken_at_once(
    open_: Callable[..., Backend],
) -> None:
    """The holder's process exited: another host claims the lease before it would expire."""
    crashed, alive = open_(), open_()
    crashed.holder = attrs.evolve(crashed.holder, pid=dead_pid())  # type: ignore[attr-defined]
    assert crashed.claim_compaction("s1")
    assert not alive.compaction_leased("s1")
    assert alive.claim_compaction("s1")
    assert crashed.compaction_leased("s1")  # the live holder's lease is respected


def test_a_reused_process_id_does_not_keep_a_lease(open_: Callable[..., Backend]) -> None:
    """A live process with the holder's id but another start time is not the holder."""
    crashed, alive = open_(), open_()
    reused = Holder(alive.holder.machine, alive.holder.pid, "0")  # type: ignore[attr-defined]
    crashed.holder = reused  # type: ignore[attr-defined]
    assert crashed.claim_compaction("s1")
    assert alive.claim_compaction("s1")


def test_another_machines_lease_lapses_without_renewal(
    open_: Callable[..., Backend], clock: Clock
) -> None:
    """A holder on another machine cannot be checked: its lease holds while renewed and
    lapses ``lease_s`` after its last renewal."""
    remote, local = open_(), open_()
    remote.holder = Holder("elsewhere", 1, "1")  # type: ignore[attr-defined]
    assert remote.claim_compaction("s1")
    lease_s = remote.lease_s  # type: ignore[attr-defined]
    clock.now += timedelta(seconds=lease_s - 1)
    assert not local.claim_compaction("s1")
    remote._renew_leases()  # type: ignore[attr-defined]
    clock.now += timedelta(seconds=lease_s - 1)
    assert not local.claim_compaction("s1")
    clock.now += timedelta(seconds=2)
    assert local.claim_compaction("s1")


def test_a_held_lease_is_renewed_while_its_work_runs(tmp_path: Path) -> None:
    """The holder renews its lease every third of ``lease_s`` until it is released."""
    with Store(tmp_path / "m.db", lease_s=0.3) as store:
        store.claim_compaction("s1")

        def expiry() -> str:
            rows = store._fetch(
                "SELECT expires_at FROM compaction_leases WHERE session_key = ?", [id_key("s1")]
            )
            return str(rows[0][0]) if rows else ""

        first, deadline = expiry(), time.monotonic() + WAIT_S
        while expiry() == first:  # the renewal is another thread's: polled, bounded
            assert time.monotonic() < deadline, "the lease was never renewed"
            time.sleep(0.05)
        store.release_compaction("s1")
        assert "" == expiry()


class Held:
    """The offline summarizer; the first ``holding`` summaries wait for ``gate``."""

    name = "offline-extractive"

    def __init__(self, holding: int) -> None:
        self.offline = OfflineSummarizer()
        self.gate, self.started = threading.Event(), threading.Semaphore(0)
        self.holding = holding
        self.lock = threading.Lock()

    def summarize(self, request: SummaryRequest) -> SummaryOutcome:
        with self.lock:
            held, self.holding = self.holding > 0, self.holding - 1
        if held:
            self.started.release()
            assert self.gate.wait(WAIT_S)
        return self.offline.summarize(request)

    def close(self) -> None:
        return None


def history(session: str, turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"You help with {session}."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"{session} question {turn}: " + "why " * 60})
        if turn < turns - 1:
            messages.append({"role": "assistant", "content": f"Answer {turn}: " + "so " * 60})
    return messages


def test_a_queued_compaction_holds_no_lease(tmp_path: Path) -> None:
    """With the one worker busy on session a, session b's compaction waits in the queue
    without a lease; it takes one when it runs."""
    summarizer = Held(holding=1)
    settings = Settings(
        context_window_chars=8_000,
        store=StoreSettings(path=str(tmp_path / "m.db")),
        compaction_workers=1,
        compaction_timeout_s=0,
        long_term_enabled=False,
    )
    with MemoryEngine(settings, summarizer=summarizer) as engine:
        reasons: dict[str, str | None] = {}
        for session in ("a", "b"):
            for turns in range(1, 30):
                report = engine.prepare(history(session, turns), session_id=session).report
                if report.skipped_reason == "timeout":
                    break
            reasons[session] = report.skipped_reason
            if session == "a":
                assert summarizer.started.acquire(timeout=WAIT_S)
        leased = engine.store._fetch("SELECT session_key FROM compaction_leases")
        summarizer.gate.set()
        assert engine.flush(timeout_s=WAIT_S)
    assert {"a": "timeout", "b": "timeout"} == reasons
    assert [id_key("a")] == [bytes(row[0]) for row in leased]


# ------------------------------------------------------------------ a proxy killed mid-compaction

SUMMARY = "## Goal\n- help\n## Facts\n- questions asked\n## Next\n- answer"
SESSIONS = [f"k{i}" for i in range(4)]


class Turns:
    """Each session's conversation through the proxy, as a client keeps it."""

    def __init__(self) -> None:
        system = {"role": "system", "content": "You are a careful assistant."}
        self.histories = {s: [system] for s in SESSIONS}
        self.turn = dict.fromkeys(SESSIONS, 0)

    def play(self, proxy: ProxyProcess, session: str) -> httpx.Response:
        number = self.turn[session]
        history = self.histories[session]
        history.append({"role": "user", "content": f"{session} question {number}: " + "why " * 50})
        response = httpx.post(
            f"{proxy.base_url}/chat/completions",
            json={"model": "m", "messages": history},
            headers={"X-Session-Id": session, "Authorization": "Bearer k"},
            timeout=WAIT_S,
        )
        assert 200 == response.status_code, response.text
        history.append(response.json()["choices"][0]["message"])
        self.turn[session] += 1
        return response


def proxy_config(tmp_path: Path, summarizer_url: str, store: dict[str, Any], **more: Any) -> Path:
    """The proxy's config: the default lease and compaction timeout unless ``more`` says."""
    config = tmp_path / f"proxy{len(more)}.yaml"
    engine = {
        "context_window_chars": 8_000,
        "store": store,
        **more,
        "long_term_enabled": False,
        "llm": {"base_url": summarizer_url, "model": "slow", "max_retries": 0, "timeout_s": 120},
        "serve": {"identity": "headers", "timeout_s": 60},
    }
    config.write_text(json.dumps(engine))
    return config


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_proxy_killed_mid_compaction_compacts_again_after_a_restart(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """kill -9 while summaries are held (two running, two queued), restart on the same store:
    with the default lease every session compacts within a few turns, no turn drops whole
    turns that no summary covers, and the store is whole."""
    if backend == "sqlite":
        store: dict[str, Any] = {"path": str(tmp_path / "m.db")}
    else:
        store = {"url": request.getfixturevalue("pg_url"), "password_env": PASSWORD_ENV}
    arrived, gate = threading.Event(), threading.Event()

    def held(_body: Any) -> str:
        if not gate.is_set():
            arrived.set()
            gate.wait(WAIT_S)
        return SUMMARY

    turns = Turns()
    with FakeOpenAI() as upstream, FakeOpenAI(default=held) as model:
        # Never waiting on a summary, so every session's compaction starts while they are held.
        config = proxy_config(tmp_path, model.base_url, store, compaction_timeout_s=0)
        first = ProxyProcess(config, upstream.base_url, cwd=tmp_path)
        try:
            due = set()
            for _ in range(40):  # turns until every session's compaction has started
                for session in SESSIONS:
                    reason = turns.play(first, session).headers.get("x-ragent-skipped-reason")
                    if reason in ("timeout", "in_progress"):
                        due.add(session)
                if due == set(SESSIONS):
                    break
            assert due == set(SESSIONS) and arrived.wait(WAIT_S)
        finally:
            first.kill()
        gate.set()  # the dead process's summaries end; the next process's are answered
        config = proxy_config(tmp_path, model.base_url, store)  # the defaults
        with ProxyProcess(config, upstream.base_url, cwd=tmp_path) as second:
            after = {s: [turns.play(second, s) for _ in range(4)] for s in SESSIONS}
    for session, responses in after.items():
        generations = [int(r.headers["x-ragent-generation"]) for r in responses]
        reasons = [r.headers.get("x-ragent-skipped-reason") for r in responses]
        assert generations[-1] >= 1, (session, generations, reasons)
        assert {"0"} == {r.headers["x-ragent-dropped-turns"] for r in responses}, session
    check_store(backend, store, turns, [r.body["messages"] for r in upstream.requests])


def pairs(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in messages]


def check_store(
    backend: str, store: dict[str, Any], turns: Turns, sent: list[list[dict[str, Any]]]
) -> None:
    """Integrity ok, one applied row per generation, and every message after a session's
    summary still in its last view (the summary covers the rest)."""
    if backend == "sqlite":
        with sqlite3.connect(store["path"]) as conn:
            assert [("ok",)] == conn.execute("PRAGMA integrity_check").fetchall()
    with open_store(StoreSettings(**store)) as opened:
        for session in SESSIONS:
            state = opened.load_session(session)
            assert state is not None and state.generation >= 1
            applied = [
                r["generation"] for r in opened.compactions(session) if r["status"] == "applied"
            ]
            assert sorted(applied) == list(range(1, state.last_generation + 1))
            asked = turns.histories[session][:-1]  # the last request, before its reply
            # The messages as the client wrote them: recall blocks the engine put on user
            # messages (the room the view leaves) taken off.
            written = [[without_recall(m) for m in view] for view in sent]
            last = [view for view in written if view[-1] == asked[-1]][-1]
            tail = pairs(asked[state.covered :])
            assert tail == pairs(last[-len(tail) :]), session
