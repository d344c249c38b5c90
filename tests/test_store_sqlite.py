"""What only the SQLite store has: its migration history from older files, and the per-turn
last-write check answered from the WAL index."""

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
from ragent_memory.store.hosts import HostTables
from ragent_memory.store.memories import MemoryTables
from ragent_memory.store.recall_index import RecallIndexTables
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
    """The per-turn check that no other process wrote the session reads the WAL index (no
    query while nothing was committed); a compaction committed by another process in
    between is seen: the next turn continues from its summary instead of compacting again."""
    db = str(tmp_path / "memory.db")
    settings = Settings(context_window_chars=20_000, store=StoreSettings(path=db))
    history = [{"role": "system", "content": "persona"}, *_chat(101)]
    with MemoryEngine(settings, summarizer=OfflineSummarizer()) as engine:
        for _ in range(2):  # the second turn's check is answered from the WAL index
            assert 0 == engine.prepare(history, session_id="s").report.generation
        assert isinstance(engine.store, Store) and engine.store._shm is not None
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


def _counting(monkeypatch: pytest.MonkeyPatch, owner: type, name: str) -> list[str]:
    """What each call of the base class's ``owner.name`` (one that reached the database)
    was asked about: its first argument."""
    asked: list[str] = []
    real = getattr(owner, name)

    def counting(self: Any, key: str) -> Any:
        asked.append(key)
        return real(self, key)

    monkeypatch.setattr(owner, name, counting)
    return asked


def _counting_queries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The session ids ``last_write`` asked the database about."""
    return _counting(monkeypatch, HostTables, "last_write")


def test_own_commits_leave_the_write_check_answered_from_the_wal_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This store's own commits (a turn's substitutions, the recall index) do not send every
    session's next check back to the database: only the sessions the commit wrote are asked
    again. Another store's commit sends them all back."""
    asked = _counting_queries(monkeypatch)
    db = tmp_path / "memory.db"
    with Store(db) as store, Store(db) as other:
        store.save_session(store.new_session("a"))
        store.last_write("a"), store.last_write("b")
        asked.clear()
        assert (store.host_id, 1) == store.last_write("a") and store.last_write("b") is None
        assert [] == asked  # answered from the WAL index
        store.save_session(store.new_session("b"))  # our own commit, writing b
        assert (store.host_id, 1) == store.last_write("b")
        assert (store.host_id, 1) == store.last_write("a")
        assert ["b"] == asked
        asked.clear()
        other.save_session(other.new_session("a"))  # another host moves a on
        assert (other.host_id, 2) == store.last_write("a")
        assert ["a"] == asked


def test_a_commit_racing_our_own_is_not_taken_for_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another store commits right after this one's commit, before this one looks at the WAL
    index again: the commit counter moved by two, so the next check asks the database."""
    db = tmp_path / "memory.db"
    with Store(db) as store, Store(db) as other:
        assert store.last_write("a") is None
        real = store._committed

        def racing(before: bytes | None) -> None:
            other.save_session(other.new_session("a"))
            real(before)

        store.db.committed = racing
        store.save_session(store.new_session("b"))
        store.db.committed = real
        assert (other.host_id, 1) == store.last_write("a")


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
        found = store.search_index(
            '"kettle"', session_id="s1", user_id="u1", visible_from=1 << 62, limit=9
        )
        assert sorted(m.position for m in found) == [0, 1, 2]


def _rows(session_id: str, texts: list[str]) -> list[IndexedMessage]:
    return [
        IndexedMessage(session_id, i, "user", text, "", index_digest("user", text))
        for i, text in enumerate(texts)
    ]


def test_known_answers_do_not_wait_on_the_store_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the recall indexer's write transaction holds the store lock (tens of ms for a
    large batch), a turn's last-write and recall-mark checks are answered from the WAL index
    without waiting for it; another connection's commit sends the recall mark back to
    the database, this one's own commits carry it forward (rows added: their highest id),
    but for one that deleted recall rows."""
    asked: list[int] = []
    real = RecallIndexTables.recall_mark

    def counting(self: Any) -> tuple[int, str]:
        asked.append(1)
        return real(self)

    monkeypatch.setattr(RecallIndexTables, "recall_mark", counting)
    db = tmp_path / "memory.db"
    with Store(db) as store, Store(db) as other:
        store.save_session(store.new_session("a"))
        known = store.last_write("a"), store.recall_mark()
        answers: list[object] = []
        with store._lock:  # as the indexer's open transaction holds it
            reader = threading.Thread(
                target=lambda: answers.append((store.last_write("a"), store.recall_mark()))
            )
            reader.start()
            reader.join(timeout=5)
            waited = reader.is_alive()
        reader.join(timeout=5)
        assert not waited and [known] == answers
        assert [1] == asked  # the second mark came from the WAL index
        top = known[1][0]
        other.index_messages("u1", _rows("s2", ["Kettle descaled."]), ["kettle descaled"])
        assert store.recall_mark()[0] > top  # another connection's commit is seen
        top = store.recall_mark()[0]
        assert 2 == len(asked)  # the mark between the two commits was known
        store.index_messages("u1", _rows("s1", ["Filter changed."]), ["filter changed"])
        store.save_session(store.new_session("b"))  # no recall rows: the mark holds
        assert real(store) == store.recall_mark() and store.recall_mark()[0] > top
        assert 2 == len(asked)  # this one's own commits: carried forward, not asked
        epoch = store.recall_mark()[1]
        store.drop_session("s1")  # rows went: a new epoch, asked of the database
        assert real(store) == store.recall_mark() and store.recall_mark()[1] != epoch
        assert 3 == len(asked)
        other.index_messages("u1", _rows("s3", ["Mug washed."]), ["mug washed"])
        store.index_messages("u1", _rows("s4", ["Tap fixed."]), ["tap fixed"])
        assert real(store) == store.recall_mark()  # another's commit came between: asked
        assert 4 == len(asked)


def test_memory_versions_are_asked_again_only_when_memories_may_have_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``memory_version`` (asked on every turn that names a user) is kept as ``last_write``'s
    answers are: this connection's own commits that change no memories keep it, one that
    changes a user's (a summary kept, a forget) drops that user's, and another
    connection's commit sends every answer back to the database."""
    real = MemoryTables.memory_version
    asked = _counting(monkeypatch, MemoryTables, "memory_version")
    db = tmp_path / "memory.db"
    with Store(db) as store, Store(db) as other:
        store.save_session(store.new_session("a"))
        assert 0 == store.memory_version("ann") == store.memory_version("bob")
        store.save_session(store.new_session("b"))  # no memory changed: both still known
        store.index_messages("ann", _rows("s1", ["Filter changed."]), ["filter changed"])
        assert 0 == store.memory_version("ann") == store.memory_version("bob")
        assert ["ann", "bob"] == asked
        store.record_summary("ann", "a", 1, "Ann likes tea.", [("ann tea", "Ann likes tea.")])
        version = store.memory_version("ann")
        assert version > 0 and 0 == store.memory_version("bob")
        assert ["ann", "bob", "ann"] == asked  # only the changed user's was asked again
        store.forget("ann")
        assert 0 == store.memory_version("ann") and ["ann", "bob", "ann", "ann"] == asked
        other.record_summary("bob", "b", 1, "Bob rows.", [("bob rows", "Bob rows.")])
        assert store.memory_version("bob") > version  # another connection's change is seen
        assert real(store, "ann") == store.memory_version("ann")
        assert ["bob", "ann"] == asked[-2:]


OTHER_WRITER = """
import sys
from ragent_memory.store import Store
with Store(sys.argv[1]) as other:
    state = other.load_session("x") or other.new_session("x")
    other.save_session(state)
    print(other.host_id)
"""


def _locks_held(path: str) -> list[str]:
    """This process's POSIX locks on ``path`` (Linux's /proc/locks, without the ordinal)."""
    stat = Path(path).stat()
    inode = f":{stat.st_ino} "
    pid = f" {os.getpid()} "
    lines = Path("/proc/locks").read_text().splitlines()
    return [line.partition(":")[2] for line in lines if inode in line and pid in line]


def test_the_mapped_wal_index_follows_other_processes(tmp_path: Path) -> None:
    """The last-write check reads the WAL index header from a mapping of the -shm file. Other
    processes opening the database, committing and closing it are seen on the next check,
    and neither reset nor remove the file under the mapping: this store's connection keeps
    its lock on the index for its whole life (closing any descriptor of the file would drop
    it) until ``close``, when the last connection out removes the file."""
    db = str(tmp_path / "memory.db")
    shm = db + "-shm"
    with Store(db) as store:
        assert store.last_write("x") is None
        assert store._shm is not None and store._header is not None
        held = _locks_held(shm)
        assert held  # SQLite's lock on the index, taken by the connection
        for round_ in (1, 2):
            other = subprocess.run(
                [sys.executable, "-c", OTHER_WRITER, db],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            assert (other.stdout.strip(), round_) == store.last_write("x")
            assert os.fstat(store._shm).st_ino == Path(shm).stat().st_ino
            assert held == _locks_held(shm)
    assert not Path(shm).exists()


def test_the_wal_is_checkpointed_off_the_writing_thread(tmp_path: Path) -> None:
    """The store's connection leaves checkpoints to a thread of their own (a turn's commit
    copied thousands of WAL pages into the file on the caller's thread): past
    ``CHECKPOINT_FRAMES`` a commit asks for one, and the WAL restarts from its start instead
    of growing to the connection's own threshold, ten times higher."""
    path = tmp_path / "wal.db"
    page = 4_096
    with Store(path) as store:
        assert (
            sqlite_backend.INLINE_CHECKPOINT_FRAMES
            == (store.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0])
        )
        checkpointer = store._checkpointer
        assert checkpointer is not None
        largest = 0
        for i in range(120):  # ~60 frames per write: 7,200 frames in all
            store.offload("s", f"{i:04d}" + "x" * 240_000, ttl_days=1)
            assert checkpointer.wait_idle(30)
            largest = max(largest, os.path.getsize(f"{path}-wal"))
        assert checkpointer.runs >= 3
        frames = sqlite_backend.CHECKPOINT_FRAMES + 200  # the threshold and one write past it
        assert largest < frames * (page + 24) + 32
        assert 120 == store.db.execute("SELECT count(*) FROM offloads").fetchone()[0]
    assert not os.path.exists(f"{path}-wal")  # the last connection closed: all checkpointed
