"""Offload lifecycle: expiry after offload_ttl_days, drop_session, gc and its CLI — with an
injected clock, never sleeps."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sessions import run_cli, tool_loop

from ragent_memory import Settings
from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.recall.refs import FOOTER_MARK, find_refs
from ragent_memory.store import GCReport
from ragent_memory.store.base import id_key

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


class Clock:
    """A settable clock returning aware UTC datetimes."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


def export(call_id: str, result: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"export {call_id}"},
        *tool_loop(call_id, result, name="export"),
    ]


def offload(engine: MemoryEngine, session_id: str, *results: str) -> list[str]:
    """Show ``results`` as oversized tool results of ``session_id``; return their refs."""
    history = [m for k, r in enumerate(results) for m in export(f"c{k}", r)]
    view = engine.prepare(history, session_id=session_id).messages
    return [find_refs(view[3 * k + 2]["content"])[0] for k in range(len(results))]


def recalls(engine: MemoryEngine, session_id: str, ref: str, original: str) -> bool:
    piece, _, _ = engine.recall(session_id, ref, 0, 10**9).rpartition(FOOTER_MARK)
    return piece == original


def rows(db_path: str, table: str, session_id: str) -> int:
    with sqlite3.connect(db_path) as conn:
        return int(
            conn.execute(
                f"SELECT COUNT(*) FROM {table} WHERE session_key = ?", [id_key(session_id)]
            ).fetchone()[0]
        )


A, B, C = "a" * 9_000, "b" * 9_500, "数据" * 5_000  # C: 10,000 chars, 30,000 UTF-8 bytes


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def engine(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings], clock: Clock
) -> MemoryEngine:
    return make_engine(make_settings(context_window_chars=40_000), clock=clock)


# ---------------------------------------------------------------------------- expiry


def test_offloads_expire_after_the_ttl_and_gc_removes_them(
    engine: MemoryEngine, clock: Clock, db_path: str
) -> None:
    """Past offload_ttl_days (7) a ref stops resolving; gc deletes it and reports it, while
    a younger offload still recalls."""
    (old,) = offload(engine, "s", A)
    clock.advance(days=3)
    (young,) = offload(engine, "t", B)
    clock.advance(days=4, seconds=1)
    assert not recalls(engine, "s", old, A)
    assert recalls(engine, "t", young, B)
    assert GCReport(expired_offloads=1, freed_bytes=9_000) == engine.gc()
    assert (0, 1) == (rows(db_path, "offloads", "s"), rows(db_path, "offloads", "t"))
    assert recalls(engine, "t", young, B)
    assert GCReport() == engine.gc()


def test_nothing_expires_before_the_ttl(engine: MemoryEngine, clock: Clock) -> None:
    """A second before the TTL the offload still recalls and gc leaves it."""
    (ref,) = offload(engine, "s", A)
    clock.advance(days=7, seconds=-1)
    assert GCReport() == engine.gc()
    assert recalls(engine, "s", ref, A)


@pytest.mark.both_backends  # reliability on PostgreSQL too
def test_offload_ttl_days_is_honoured(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings], clock: Clock
) -> None:
    """The TTL comes from offload_ttl_days; freed bytes are UTF-8 bytes, not chars."""
    engine = make_engine(
        make_settings(context_window_chars=40_000, offload_ttl_days=0.5), clock=clock
    )
    (ref,) = offload(engine, "s", C)
    clock.advance(hours=11)
    assert recalls(engine, "s", ref, C)
    clock.advance(hours=1)
    assert GCReport(expired_offloads=1, freed_bytes=30_000) == engine.gc()


def test_an_original_is_stored_once_and_seeing_it_again_extends_it(
    engine: MemoryEngine, clock: Clock, db_path: str
) -> None:
    """The same text shown again in the session is one row whose expiry moves forward."""
    (first,) = offload(engine, "s", A)
    clock.advance(days=5)
    history = [*export("c0", A), *export("again", A)]
    (again,) = find_refs(engine.prepare(history, session_id="s").messages[5]["content"])
    clock.advance(days=5)
    assert first == again
    assert 1 == rows(db_path, "offloads", "s")
    assert GCReport() == engine.gc()
    assert recalls(engine, "s", first, A)


# ---------------------------------------------------------------------------- dropped sessions


def test_drop_session_stops_its_refs_at_once_and_gc_removes_everything(
    engine: MemoryEngine, db_path: str
) -> None:
    """A dropped session's refs stop resolving immediately; gc deletes its offloads and
    reports them; other sessions are untouched."""
    dropped = offload(engine, "s", A, C)
    (kept,) = offload(engine, "t", B)
    engine.drop_session("s")
    assert [
        f"[recall: ref {ref!r} not found in this session (unknown, expired or dropped)]"
        for ref in dropped
    ] == [engine.recall("s", ref) for ref in dropped]
    assert (0, 0) == (rows(db_path, "substitutions", "s"), rows(db_path, "sessions", "s"))
    report = engine.gc()
    assert GCReport(dropped_sessions=1, dropped_offloads=2, freed_bytes=39_000) == report
    for table in ("offloads", "substitutions", "sessions", "dropped_sessions"):
        assert 0 == rows(db_path, table, "s")
    assert 1 == rows(db_path, "offloads", "t")
    assert recalls(engine, "t", kept, B)
    assert GCReport() == engine.gc()


def test_gc_reports_expired_and_dropped_separately(engine: MemoryEngine, clock: Clock) -> None:
    """An expired offload of a dropped session counts once, as dropped."""
    offload(engine, "s", A)
    offload(engine, "t", B)
    clock.advance(days=8)
    engine.drop_session("s")
    expected = GCReport(
        expired_offloads=1, dropped_sessions=1, dropped_offloads=1, freed_bytes=18_500
    )
    assert expected == engine.gc()


@pytest.mark.both_backends  # reliability on PostgreSQL too
def test_a_dropped_session_stays_dropped_across_restarts(
    make_settings: Callable[..., Settings], clock: Clock
) -> None:
    """A new engine on the same store serves no ref of a dropped session."""
    settings = make_settings(context_window_chars=40_000)
    with MemoryEngine(settings, clock=clock) as engine:
        (ref,) = offload(engine, "s", A)
        engine.drop_session("s")
    with MemoryEngine(settings, clock=clock) as engine:
        assert not recalls(engine, "s", ref, A)
        assert 1 == engine.gc().dropped_offloads


def test_a_dropped_id_used_again_starts_fresh(engine: MemoryEngine, db_path: str) -> None:
    """Reusing a dropped id before gc starts a new session whose refs survive the gc."""
    offload(engine, "s", A)
    engine.drop_session("s")
    (ref,) = offload(engine, "s", A)
    assert recalls(engine, "s", ref, A)
    assert GCReport() == engine.gc()
    assert recalls(engine, "s", ref, A)
    assert 1 == rows(db_path, "offloads", "s")


# ---------------------------------------------------------------------------- the CLI


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, timeout_s=60)


def test_cli_gc_prints_what_it_removed(
    make_engine: Callable[..., MemoryEngine],
    make_settings: Callable[..., Settings],
    db_path: str,
    tmp_path: Path,
) -> None:
    """`ragent-memory gc --db PATH` deletes expired and dropped offloads and prints counts."""
    month_ago = Clock(datetime.now(UTC) - timedelta(days=30))
    engine = make_engine(make_settings(context_window_chars=40_000), clock=month_ago)
    offload(engine, "old", A)
    month_ago.now = datetime.now(UTC)
    offload(engine, "gone", C)
    offload(engine, "live", B)
    engine.drop_session("gone")
    engine.close()
    done = cli("gc", "--db", db_path, cwd=tmp_path)
    assert (0, "") == (done.returncode, done.stderr)
    assert (
        "removed 1 expired offloads and 1 offloads of 1 dropped sessions; freed 39,000 bytes\n"
        == done.stdout
    )
    again = cli("gc", "--db", db_path, "--json", cwd=tmp_path)
    assert 0 == again.returncode
    assert {
        "expired_offloads": 0,
        "dropped_sessions": 0,
        "dropped_offloads": 0,
        "freed_bytes": 0,
    } == json.loads(again.stdout)
    assert 1 == rows(db_path, "offloads", "live")


@pytest.mark.parametrize("kind", ["missing", "directory", "not_a_database"])
def test_cli_gc_user_errors_exit_2_with_one_line(tmp_path: Path, kind: str) -> None:
    """A missing store, a directory or a file that is not SQLite: exit 2, one line, and no
    store is created by accident."""
    path = tmp_path / "nowhere" / "memory.db"
    if kind == "directory":
        path = tmp_path
    elif kind == "not_a_database":
        path = tmp_path / "notes.db"
        path.write_text("not sqlite " * 200)
    done = cli("gc", "--db", str(path), cwd=tmp_path)
    assert 2 == done.returncode
    assert ("", 1) == (done.stdout, len(done.stderr.splitlines()))
    assert done.stderr.startswith("error: ")
    assert not (tmp_path / "nowhere").exists()
