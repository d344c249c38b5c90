"""What only the PostgreSQL store has: credentials from the environment, many hosts on one
database (docs/design.md §10 "Many hosts")."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import PASSWORD_ENV, admin
from host_worker import history, host_settings, play
from pg_server import PASSWORD
from sessions import run_cli, user

from ragent_memory import ConfigError, MemoryEngine, Settings, StoreError, StoreSettings
from ragent_memory.store import Backend, Store, open_store, utc_now
from ragent_memory.summary.offline import OfflineSummarizer
from ragent_memory.summary.summarize import SummaryOutcome, SummaryRequest


def test_the_password_is_read_from_the_named_variable(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unset variable is a ConfigError naming store.password_env."""
    monkeypatch.delenv(PASSWORD_ENV)
    settings = Settings(store=StoreSettings(url=pg_url, password_env=PASSWORD_ENV))
    with pytest.raises(ConfigError, match=f"store.password_env.*{PASSWORD_ENV}"):
        MemoryEngine(settings)


def test_a_refused_login_never_shows_the_password(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong password is a StoreError naming the URL, without the password in it."""
    wrong = PASSWORD + "-wrong"
    monkeypatch.setenv(PASSWORD_ENV, wrong)
    settings = Settings(store=StoreSettings(url=pg_url, password_env=PASSWORD_ENV))
    with pytest.raises(StoreError) as info:
        MemoryEngine(settings)
    assert pg_url in str(info.value) and "password authentication failed" in str(info.value)
    assert wrong not in str(info.value) and PASSWORD not in str(info.value)


# ---------------------------------------------------------------------------- many hosts

WORKER = Path(__file__).resolve().parents[1] / "host_worker.py"
ANSWER_TIMEOUT_S = 600.0


class Host:
    """A ``host_worker.py`` process: one agent host with its own engine on the shared store."""

    def __init__(self, url: str, tmp_path: Path, *, lease_s: float = 600.0) -> None:
        self.log = (tmp_path / f"host-{id(self)}.log").open("w+")
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), url, PASSWORD_ENV, str(lease_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self.answers: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.answers.put(line)
        self.answers.put("")  # the process is gone

    def ask(self, **command: Any) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def answer(self) -> dict[str, Any]:
        line = self.answers.get(timeout=ANSWER_TIMEOUT_S)
        if not line:
            self.log.seek(0)
            raise AssertionError(f"host exited ({self.process.wait(5)}): {self.log.read()[-3000:]}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def stop(self) -> None:
        if self.process.poll() is None:
            self.ask(op="quit")
        code = self.process.wait(timeout=120)
        self._close()
        assert 0 == code

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=60)
        self._close()

    def _close(self) -> None:
        self.reader.join(timeout=60)
        assert not self.reader.is_alive()
        for stream in (self.process.stdin, self.process.stdout, self.log):
            if stream is not None:
                stream.close()


def pg_store(url: str) -> Backend:
    return open_store(StoreSettings(url=url, password_env=PASSWORD_ENV))


def test_two_hosts_hand_sessions_back_and_forth(pg_url: str, tmp_path: Path) -> None:
    """Two processes, 50 sessions each, swap sessions every 3 turns: every prepared context
    equals a single-process run's, and each session's generations are 1..n, audited once."""
    turns, stride = 12, 3
    groups = ([f"a{i}" for i in range(50)], [f"b{i}" for i in range(50)])
    hosts = (Host(pg_url, tmp_path), Host(pg_url, tmp_path))
    digests: dict[str, list[str]] = {s: [] for s in groups[0] + groups[1]}
    last: dict[str, Any] = {}
    try:
        for round_, first in enumerate(range(0, turns, stride)):
            order = groups if round_ % 2 == 0 else groups[::-1]  # hand every session over
            for host, sessions in zip(hosts, order, strict=True):
                host.ask(op="run", sessions=sessions, turns=[first, first + stride])
            for host in hosts:
                answer = host.answer()
                for session, seen in answer["digests"].items():
                    digests[session] += seen
                last.update(answer["last"])
    finally:
        for host in hosts:
            host.stop()

    with pg_store(pg_url) as store:
        rows = store.compactions()
        generations = {s: store.load_session(s) for s in digests}
        with store._locked("read") as db:  # type: ignore[attr-defined]
            (secret,) = db.execute("SELECT value FROM meta WHERE key = 'secret'").fetchone()

    # The reference: one process, one SQLite store with the same secret (so the same refs).
    path = tmp_path / "single.db"
    with Store(path) as single:
        single.db.execute("UPDATE meta SET value = ? WHERE key = 'secret'", [secret])
    reference: dict[str, list[str]] = {s: [] for s in digests}
    reference_last: dict[str, Any] = {}
    with MemoryEngine(host_settings(StoreSettings(path=str(path)))) as engine:
        for session in digests:
            for turn in range(turns):
                for digest, messages in play(engine, session, turn):
                    reference[session].append(digest)
                    reference_last[session] = messages
        reference_generations = {s: engine.store.load_session(s) for s in digests}

    assert reference == digests
    assert reference_last == last
    assert [] == [r for r in rows if r["status"] != "applied"]
    for session, state in generations.items():
        assert state is not None and reference_generations[session] == state
        applied = sorted(r["generation"] for r in rows if r["session_id"] == session)
        assert list(range(1, state.last_generation + 1)) == applied, session
    # The workload is seeded per session: every session compacts, nearly all of them twice or
    # more, so hand-overs happen with summaries in play.
    assert all(state is not None and state.generation >= 1 for state in generations.values())
    assert sum(state is not None and state.generation >= 2 for state in generations.values()) >= 90


def test_a_host_killed_mid_compaction_loses_its_lease_at_once(pg_url: str, tmp_path: Path) -> None:
    """The dead host's process is gone from this machine: its lease (600 s here) is taken at
    once, and the next host compacts on its first due turn."""
    dying = Host(pg_url, tmp_path, lease_s=600.0)
    dying.ask(op="block")
    assert {"ok": True} == dying.answer()
    dying.ask(op="run", sessions=["s1"], turns=[0, 18])
    assert {"summarizing": True} == dying.answer()
    dying.kill()

    store = StoreSettings(url=pg_url, password_env=PASSWORD_ENV, lease_s=600.0)
    with MemoryEngine(host_settings(store)) as engine:
        turn, reports = 0, []
        while not reports or not reports[-1].compacted:
            assert turn < 18, "no compaction after the kill"
            full = history("s1", turn + 1)
            reports.append(engine.prepare(full[:-3], session_id="s1").report)
            turn += 1
        rows = engine.store.compactions("s1")
    assert "in_progress" not in [r.skipped_reason for r in reports]
    assert [(1, "applied")] == [(r["generation"], r["status"]) for r in rows]


def test_a_late_compaction_from_another_host_is_stale(pg_url: str) -> None:
    """Host A's compaction outlives its lease; host B compacts meanwhile. A's result is audited
    stale, never applied, and A continues from B's generation."""
    gate = threading.Event()
    store = StoreSettings(url=pg_url, password_env=PASSWORD_ENV, lease_s=30.0)
    clock = Clock(utc_now())
    full = history("s1", 12)
    with (
        MemoryEngine(
            host_settings(store, compaction_timeout_s=0.05), summarizer=Gated(gate)
        ) as slow,
        MemoryEngine(host_settings(store), clock=clock) as fast,
    ):
        turn = 1
        while (
            slow.prepare(history("s1", turn)[:-3], session_id="s1").report.skipped_reason
            != "timeout"
        ):
            turn += 1
            assert turn <= 12, "no compaction became due"
        full = history("s1", turn)[:-3]
        assert "in_progress" == fast.prepare(full, session_id="s1").report.skipped_reason
        clock.now += timedelta(seconds=31)
        assert 1 == fast.prepare(full, session_id="s1").report.generation
        gate.set()
        assert slow.flush(timeout_s=60)
        again = slow.prepare(full, session_id="s1")
        rows = slow.store.compactions("s1")
        assert fast.prepare(full, session_id="s1").messages == again.messages
    assert 1 == again.report.generation
    assert [(1, "applied", "over_trigger"), (1, "failed", "stale")] == [
        (r["generation"], r["status"], r["reason"]) for r in rows
    ]


class Gated:
    """The offline summarizer, held until ``gate`` is set."""

    name = "offline-extractive"

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate
        self.offline = OfflineSummarizer()

    def summarize(self, request: SummaryRequest) -> SummaryOutcome:
        assert self.gate.wait(timeout=60)
        return self.offline.summarize(request)

    def close(self) -> None:
        return None


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


# ---------------------------------------------------------------------------- migrate


def test_migrate_copies_a_sqlite_store_into_postgresql(pg_url: str, db_path: str) -> None:
    """`ragent-memory migrate` (a real subprocess) copies everything: the audit, sessions,
    substitutions, offloads behind the same refs, memories; a session then continues on
    PostgreSQL exactly as on SQLite, and its recall index answers the same search. A second
    copy into the same database is refused."""
    facts = [user("My name is Anna."), user("I live in Lisbon."), user("I prefer tea.")]
    sqlite_settings = StoreSettings(path=db_path)
    with MemoryEngine(host_settings(sqlite_settings, recall_enabled=True)) as engine:
        for turn in range(8):
            play(engine, "m1", turn)
        engine.prepare(history("m1", 8)[:-3], session_id="m1", user_id="u1")
        engine.after_turn(facts, session_id="m2", user_id="u1")
        assert engine.flush(timeout_s=60)

    done = run_cli("migrate", "--from", db_path, "--to", pg_url, "--password-env", PASSWORD_ENV)
    assert 0 == done.returncode, done.stderr
    assert "copied" in done.stdout and "compactions" in done.stdout

    with Store(db_path) as sqlite, pg_store(pg_url) as postgres:
        subs = sqlite.substitutions("m1")
        assert subs and subs == postgres.substitutions("m1")
        for sub in subs.values():
            assert sqlite.read_offload("m1", sub.ref) == postgres.read_offload("m1", sub.ref)
        assert sqlite.compactions() and sqlite.compactions() == postgres.compactions()
        assert sqlite.load_session("m1") == postgres.load_session("m1")
        assert sqlite.facts("u1") and sqlite.facts("u1") == postgres.facts("u1")
        assert sqlite.memory_rows("u1") == postgres.memory_rows("u1")
        assert sqlite.memory_version("u1") == postgres.memory_version("u1")

    continued = []
    for store in (
        StoreSettings(path=db_path),
        StoreSettings(url=pg_url, password_env=PASSWORD_ENV),
    ):
        with MemoryEngine(host_settings(store)) as engine:
            continued.append(engine.prepare(history("m1", 11)[:-3], session_id="m1", user_id="u1"))
    assert continued[0].messages == continued[1].messages
    assert continued[0].report.generation == continued[1].report.generation

    found = []
    for store in (sqlite_settings, StoreSettings(url=pg_url, password_env=PASSWORD_ENV)):
        with MemoryEngine(host_settings(store, recall_enabled=True)) as engine:
            found.append(engine.search("m3", "where do I live", user_id="u1"))
    assert "Lisbon" in found[0] and found[0] == found[1]

    again = run_cli("migrate", "--from", db_path, "--to", pg_url, "--password-env", PASSWORD_ENV)
    assert 2 == again.returncode
    assert "not empty" in again.stderr


def test_a_database_missing_a_table_is_refused_at_start(fresh_pg_url: str) -> None:
    """Migrations recorded but a table dropped: opening names what is missing."""
    pg_store(fresh_pg_url).close()
    with admin(fresh_pg_url) as conn:
        conn.execute("DROP TABLE offloads")
    with pytest.raises(StoreError, match="tables offloads are missing"):
        pg_store(fresh_pg_url)
