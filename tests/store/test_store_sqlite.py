"""What only the SQLite store has: its migration history from older files, the per-turn
checks read on a connection of their own, and its WAL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from ragent_memory import MemoryEngine, Settings
from ragent_memory.core.records import IndexedMessage, Substitution
from ragent_memory.recall.index import index_digest
from ragent_memory.settings import StoreSettings
from ragent_memory.store import MIGRATIONS, Store, substitution_key
from ragent_memory.store import sqlite as sqlite_backend
from ragent_memory.summary.offline import OfflineSummarizer


def test_substitution_keys_survive_the_rename_migration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SQLite store written before migration 004 keeps its substitutions under ``key``."""
    path = tmp_path / "old.db"
    sub = Substitution(substitution_key(3, "abc"), "trim", "rm-1", {"role": "tool", "content": "x"})
    with monkeypatch.context() as patch:
        patch.setattr(sqlite_backend, "MIGRATIONS", MIGRATIONS[:3])
        with Store(path) as old:
            old.db.execute(
                "INSERT INTO substitutions (session_id, digest, kind, ref, message, created_at)"
                " VALUES ('s1', ?, 'trim', 'rm-1', ?, '2025-01-01T00:00:00.000Z')",
                [sub.key, json.dumps(sub.message)],
            )
            old.db.conn.commit()
    with Store(path) as store:
        assert {sub.key: sub} == store.substitutions("s1")
        names = store.migrations()
        columns = [r[1] for r in store.db.execute("PRAGMA table_info(substitutions)")]
    assert [name for name, _ in MIGRATIONS] == names
    assert "key" in columns and "digest" not in columns


OTHER_PROCESS = """
import json, sys
from ragent_memory import MemoryEngine, Settings
from ragent_memory.summary.offline import OfflineSummarizer
from ragent_memory.settings import StoreSettings
db, path = sys.argv[1], sys.argv[2]
history = json.loads(open(path).read())
settings = Settings(context_window_chars=20_000, store=StoreSettings(path=db))
with MemoryEngine(settings, summarizer=OfflineSummarizer()) as engine:
    print(engine.prepare(history, session_id="s").report.generation)
"""


def _chat(count: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " + "w" * 90}
        for i in range(start, start + count)
    ]


def test_a_session_another_process_moved_on_is_reloaded(tmp_path: Path) -> None:
    """The per-turn check that no other process wrote the session sees a compaction
    committed by another process in between: the next turn continues from its summary
    instead of compacting again."""
    db = str(tmp_path / "memory.db")
    settings = Settings(context_window_chars=20_000, store=StoreSettings(path=db))
    history = [{"role": "system", "content": "persona"}, *_chat(101)]
    with MemoryEngine(settings, summarizer=OfflineSummarizer()) as engine:
        for _ in range(2):
            assert 0 == engine.prepare(history, session_id="s").report.generation
        history += _chat(60, start=101)
        shared = tmp_path / "history.json"
        shared.write_text(json.dumps(history))
        other = subprocess.run(
            [sys.executable, "-c", OTHER_PROCESS, db, str(shared)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert "1" == other.stdout.strip()
        report = engine.prepare(history, session_id="s").report
        statuses = [r["status"] for r in engine.store.compactions("s")]
    assert (1, False) == (report.generation, report.compacted)
    assert ["applied"] == statuses


def _fresh(store: Store) -> tuple[Any, ...]:
    """What a new connection reads now: the answers every check must give."""
    with Store(store.path) as reader:
        return reader.last_write("a"), reader.memory_version("ann"), reader.recall_mark()


def _checks(store: Store) -> tuple[Any, ...]:
    return store.last_write("a"), store.memory_version("ann"), store.recall_mark()


def test_every_commit_is_seen_by_the_next_check(tmp_path: Path) -> None:
    """The per-turn checks (who wrote a session last, a user's memory version, the recall
    mark) answer what was last committed: by this store, by another store on the file, or
    by another store right after this one's commit."""
    db = tmp_path / "memory.db"
    with Store(db) as store, Store(db) as other:
        assert (None, 0, (0, "")) == _checks(store)
        store.save_session(store.new_session("a"))
        assert (store.host_id, 1) == store.last_write("a")
        store.save_session(store.new_session("b"))
        assert store.last_write("a") == (store.host_id, 1) == store.last_write("b")
        other.save_session(other.new_session("a"))  # another host moves a on
        assert (other.host_id, 2) == store.last_write("a")
        store.record_summary("ann", "a", 1, "Ann likes tea.", [("ann tea", "Ann likes tea.")])
        version = store.memory_version("ann")
        assert version > 0 and 0 == store.memory_version("bob")
        other.record_summary("bob", "b", 1, "Bob rows.", [("bob rows", "Bob rows.")])
        assert store.memory_version("bob") > version
        store.forget("ann")
        assert 0 == store.memory_version("ann")
        top = store.recall_mark()[0]
        other.index_messages("u1", _rows("s2", ["Kettle descaled."]), ["kettle descaled"])
        assert store.recall_mark()[0] > top
        store.index_messages("u1", _rows("s1", ["Filter changed."]), ["filter changed"])
        epoch = store.recall_mark()[1]
        store.drop_session("s1")  # rows went: a new epoch
        assert store.recall_mark()[1] != epoch
        assert _fresh(store) == _checks(store)
        store.save_session(store.new_session("c"))
        other.save_session(other.new_session("a"))  # right after this store's commit
        assert (other.host_id, 3) == store.last_write("a")
        assert _fresh(store) == _checks(store)


def test_a_batch_of_index_rows_is_one_fts5_segment(tmp_path: Path) -> None:
    """The recall index writes a batch's rows, then their FTS5 terms: a statement on another
    table between two FTS5 inserts made FTS5 flush a segment per row (merged again at the
    commit), most of the index write's cost. The rows and their search are unchanged."""
    texts = [f"Kettle number {i} was descaled." for i in range(3)]
    rows = [
        IndexedMessage("s1", i, "user", text, "", index_digest("user", text))
        for i, text in enumerate(texts)
    ]
    with Store(tmp_path / "x.db") as store:
        assert store.index_messages("u1", rows, texts) == 3
        assert store.index_messages("u1", rows, texts) == 0  # already indexed: skipped
        segments = store.db.execute("SELECT count(DISTINCT segid) FROM recall_fts_idx")
        assert segments.fetchone()[0] == 1
        found = store.recall_candidates(["kettle"], session_id="s1", user_id="u1")
        assert sorted(m.position for m, _, _ in found.found) == [0, 1, 2]


def _rows(session_id: str, texts: list[str]) -> list[IndexedMessage]:
    return [
        IndexedMessage(session_id, i, "user", text, "", index_digest("user", text))
        for i, text in enumerate(texts)
    ]


def test_the_checks_do_not_wait_for_the_store_lock(tmp_path: Path) -> None:
    """While the recall indexer's write transaction holds the store lock (a large batch),
    a turn's checks, on ``serve``'s event loop too, are answered without waiting for it:
    from what was last committed, not the transaction's rows."""
    db = tmp_path / "memory.db"
    with Store(db) as store:
        store.save_session(store.new_session("a"))
        committed = _checks(store)
        answers: list[object] = []
        with store._lock, store.db.atomic():  # as the indexer's open transaction holds it
            store.index_messages("u1", _rows("s1", ["Filter changed."]), ["filter changed"])
            store.save_session(store.new_session("a"))
            reader = threading.Thread(target=lambda: answers.append(_checks(store)))
            reader.start()
            reader.join(timeout=5)
            waited = reader.is_alive()
        reader.join(timeout=5)
        assert not waited and [committed] == answers
        assert (store.host_id, 2) == store.last_write("a") and store.recall_mark()[0] > 0


OTHER_WRITER = """
import sys
from ragent_memory.store import Store
with Store(sys.argv[1]) as other:
    state = other.load_session("x") or other.new_session("x")
    other.save_session(state)
    print(other.host_id)
"""


def test_other_processes_commits_are_seen(tmp_path: Path) -> None:
    """Other processes opening the database, committing and closing it are seen on the
    next check; once this store closes (both its connections), the last connection out
    removes the WAL index."""
    db = str(tmp_path / "memory.db")
    with Store(db) as store:
        assert store.last_write("x") is None
        for round_ in (1, 2):
            other = subprocess.run(
                [sys.executable, "-c", OTHER_WRITER, db],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            assert (other.stdout.strip(), round_) == store.last_write("x")
    assert not Path(db + "-shm").exists()
    assert not Path(db + "-wal").exists()


def test_the_wal_stays_bounded(tmp_path: Path) -> None:
    """SQLite checkpoints the WAL past its threshold of 1,000 frames, and it restarts from
    its start instead of growing with the store (the reading connection holds no snapshot
    between reads)."""
    path = tmp_path / "wal.db"
    page = 4_096
    with Store(path) as store:
        largest = 0
        for i in range(120):  # ~60 frames per write: 7,200 frames in all
            store.offload_all("s", [f"{i:04d}" + "x" * 240_000], ttl_days=1)
            store.last_write("s")
            largest = max(largest, os.path.getsize(f"{path}-wal"))
        frames = 1_000 + 200  # the threshold and one write past it
        assert largest < frames * (page + 24) + 32
        assert 120 == store.db.execute("SELECT count(*) FROM offloads").fetchone()[0]
    assert not os.path.exists(f"{path}-wal")  # the last connection closed: all checkpointed
