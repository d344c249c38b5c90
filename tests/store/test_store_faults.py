"""Store faults found by the reliability review, each pinned by its reproduction: two writers on one file,
the audit row committing with its generation, audit figures that are what happened, hostile
store paths refused at start-up, and gc handing freed pages back to the disk."""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sessions import run_cli, tool_loop

from ragent_memory import Settings, StoreSettings
from ragent_memory.core.chars import chars
from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.errors import StoreError
from ragent_memory.store import MIGRATIONS, Store
from ragent_memory.summary.offline import OfflineSummarizer
from ragent_memory.summary.summarize import SummaryOutcome, SummaryRequest

NOBODY = 65534


def test_a_reading_transaction_waits_for_another_writer_instead_of_failing(db_path: str) -> None:
    """A transaction that reads then writes, while another connection writes, waits out the
    busy timeout instead of failing at once with `database is locked`."""
    a, b = Store(db_path), Store(db_path)
    wrote = threading.Event()
    errors: list[BaseException] = []

    def write_b() -> None:
        try:
            b.db.execute("INSERT INTO meta VALUES ('x', 'y')")
        except BaseException as err:  # reported to the test thread
            errors.append(err)
        wrote.set()

    writer = threading.Thread(target=write_b)
    with a.db.atomic():
        a.db.execute("SELECT COUNT(*) FROM sessions").fetchone()
        writer.start()
        assert not wrote.wait(0.2)  # b waits for a's transaction, it does not fail
        a.db.execute("INSERT INTO meta VALUES ('z', 'w')")
    assert wrote.wait(30)
    writer.join(30)
    assert [] == errors
    keys = {r[0] for r in a.db.execute("SELECT key FROM meta WHERE key IN ('x', 'z')")}
    assert {"x", "z"} == keys
    a.close()
    b.close()


def test_two_stores_opening_a_new_file_at_once_migrate_it_once(tmp_path: Path) -> None:
    """Migrations are checked under the write lock: concurrent first opens never collide."""
    path = str(tmp_path / "new.db")
    stores: list[Store] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def open_store() -> None:
        barrier.wait(10)
        try:
            stores.append(Store(path))
        except BaseException as err:  # reported to the test thread
            errors.append(err)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [] == errors
    assert 4 == len(stores)
    assert [name for name, _ in MIGRATIONS] == stores[0].migrations()
    for store in stores:
        store.close()


def test_opening_a_new_file_another_connection_is_writing_waits_for_it(tmp_path: Path) -> None:
    """Switching a new file to WAL needs it to itself, and SQLite refuses that at once while
    another connection holds its write lock (no busy handler): the open waits its turn
    instead of failing with `database is locked` (the race of the test above, made certain)."""
    path = str(tmp_path / "new.db")
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE app (x)")
    other.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.2, lambda: other.execute("COMMIT"))
    release.start()
    try:
        with Store(path) as store:
            assert "wal" == store.db.execute("PRAGMA journal_mode").fetchone()[0]
            assert [name for name, _ in MIGRATIONS] == store.migrations()
    finally:
        release.join(10)
        other.close()


# ---------------------------------------------------------------------------- audit figures


def results_history(turns: int, *, size: int = 900) -> list[dict[str, Any]]:
    """A session of search turns whose results are evictable (trimmed before compaction)."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a support agent."}]
    for turn in range(turns):
        history.append({"role": "user", "content": f"question {turn} about refunds, please"})
        history += tool_loop(f"c{turn}", f"result {turn} " + "lorem ipsum " * (size // 12))
        history.append({"role": "assistant", "content": f"answer {turn}: see the policy"})
    return history


class Recording:
    """The offline summarizer, recording what it was handed."""

    name = "recording"

    def __init__(self, *, use_half: bool = False) -> None:
        self.offline = OfflineSummarizer()
        self.received: list[int] = []
        self.use_half = use_half

    def summarize(self, request: SummaryRequest) -> SummaryOutcome:
        material = request.material
        if self.use_half:  # a summarizer bounding its input reports what it used
            material = material[len(material) // 2 :]
        sent = sum(chars(m) for m in material)
        self.received.append(sent)
        outcome = self.offline.summarize(
            SummaryRequest(material, request.previous, request.language, request.max_chars)
        )
        return SummaryOutcome(
            outcome.body, self.name, 1, material_chars=sent if self.use_half else None
        )

    def close(self) -> None:
        return None


@pytest.mark.parametrize("use_half", [False, True])
def test_audit_figures_are_what_happened(
    make_settings: Callable[..., Settings], use_half: bool
) -> None:
    """`chars_after` equals the `chars_out` of the turn that applied it, and `material_chars`
     equals what the summarizer received: the raw originals, not their trim placeholders
    ."""
    summarizer = Recording(use_half=use_half)
    settings = make_settings(context_window_chars=20_000)
    applied: list[int] = []
    with MemoryEngine(settings, summarizer=summarizer) as engine:
        history = results_history(2)
        for turn in range(2, 90):
            history.append({"role": "user", "content": f"question {turn} about refunds"})
            report = engine.prepare(history, session_id="s1").report
            if report.compacted:
                applied.append(report.chars_out)
            history += tool_loop(f"c{turn}", f"result {turn} " + "lorem ipsum " * 75)
            history.append({"role": "assistant", "content": f"answer {turn}: " + "see " * 150})
        rows = [r for r in engine.store.compactions("s1") if r["status"] == "applied"]
    assert len(applied) >= 2
    assert applied == [r["chars_after"] for r in rows]
    assert summarizer.received == [r["material_chars"] for r in rows]
    # The view the material was cut from held placeholders: what was sent is larger.
    assert all(r["material_chars"] * 2 > r["chars_before"] for r in rows) or use_half


# ---------------------------------------------------------------------------- hostile stores


def store_error(path: str) -> str:
    with pytest.raises(StoreError) as caught:
        Store(path)
    return str(caught.value)


def test_a_store_path_under_a_regular_file_is_a_store_error(tmp_path: Path) -> None:
    """A path whose parent is a file: StoreError naming the path, not FileExistsError."""
    (tmp_path / "plain").write_text("x")
    path = str(tmp_path / "plain" / "memory.db")
    message = store_error(path)
    assert path in message
    assert "directory" in message


def test_a_directory_as_store_path_is_a_store_error(tmp_path: Path) -> None:
    """A path that is a directory: StoreError naming it."""
    message = store_error(str(tmp_path))
    assert str(tmp_path) in message
    assert "directory" in message


def test_recorded_migrations_with_a_missing_table_are_refused(db_path: str) -> None:
    """A database whose migrations are recorded but a table is gone fails at start-up,
    naming the table, instead of failing on every later prepare."""
    Store(db_path).close()
    with sqlite3.connect(db_path) as conn:
        conn.execute("DROP TABLE substitutions")
    message = store_error(db_path)
    assert db_path in message
    assert "substitutions" in message
    with pytest.raises(StoreError):
        MemoryEngine(Settings(store=StoreSettings(path=db_path)))


def test_a_file_that_is_not_sqlite_is_a_store_error(tmp_path: Path) -> None:
    """Garbage in the file: StoreError naming the path."""
    path = tmp_path / "junk.db"
    path.write_bytes(b"not a database" * 100)
    assert str(path) in store_error(str(path))


def as_nobody(action: Callable[[], str]) -> str:
    """Run ``action`` in a forked child as an unprivileged user (root ignores file modes);
    return what it returned, or the exception's type and text."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read)
        try:
            if os.getuid() == 0:
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            out = action()
        except BaseException as err:
            out = f"{type(err).__name__}: {err}"
        os.write(write, out.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        out = pipe.read().decode()
    os.waitpid(pid, 0)
    return out


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory an unprivileged user can reach (pytest's tmp_path is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="ragent-faults-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def open_store(path: str) -> Callable[[], str]:
    def action() -> str:
        Store(path).close()
        return "opened"

    return action


def test_a_read_only_store_file_is_refused_at_start_up(shared_dir: Path) -> None:
    """A read-only database file: StoreError at construction naming the path, not an engine
    that starts and then fails every write."""
    path = str(shared_dir / "ro.db")
    Store(path).close()
    os.chmod(path, 0o444)
    out = as_nobody(open_store(path))
    assert out.startswith("StoreError:")
    assert path in out
    assert "not writable" in out or "readonly" in out


def test_a_store_in_a_read_only_directory_is_refused_at_start_up(shared_dir: Path) -> None:
    """A new store in a directory nobody may write: StoreError naming the path."""
    folder = shared_dir / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    path = str(folder / "memory.db")
    out = as_nobody(open_store(path))
    assert out.startswith("StoreError:")
    assert path in out


def test_a_writable_store_opens_for_an_unprivileged_user(shared_dir: Path) -> None:
    """The child helper itself works: the same user opens a store it may write."""
    folder = shared_dir / "open"
    folder.mkdir()
    folder.chmod(0o777)
    assert "opened" == as_nobody(open_store(str(folder / "memory.db")))


# ---------------------------------------------------------------------------- gc frees disk


def fill_and_drop(engine: MemoryEngine, sessions: int) -> None:
    for number in range(sessions):
        history = [{"role": "user", "content": "export everything"}]
        history += tool_loop(f"c{number}", f"{number} " + "x" * 300_000, name="export")
        engine.prepare(history, session_id=f"s{number}")
        engine.drop_session(f"s{number}")


def test_gc_hands_freed_pages_back_to_the_disk(make_settings: Callable[..., Settings]) -> None:
    """Deleting offloads shrinks the file, not only the row count."""
    with MemoryEngine(make_settings(context_window_chars=40_000)) as engine:
        fill_and_drop(engine, 8)
        report = engine.gc()
    assert 8 == report.dropped_offloads
    assert report.file_bytes_before > 2_000_000
    assert report.file_bytes_after < report.file_bytes_before // 4


def test_gc_vacuum_shrinks_a_store_created_without_incremental_vacuum(
    db_path: str, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    """An older file (auto_vacuum off) keeps its size on a plain gc; `gc --vacuum` frees it
    and switches the file to incremental vacuum."""
    with sqlite3.connect(db_path) as conn:
        conn.execute("PRAGMA auto_vacuum = NONE")
        conn.execute(
            "CREATE TABLE _migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
            " applied_at TEXT NOT NULL)"
        )
    with MemoryEngine(make_settings(context_window_chars=40_000)) as engine:
        fill_and_drop(engine, 8)
        plain = engine.gc()
        assert plain.file_bytes_after > 2_000_000  # pages freed inside the file only
    done = run_cli("gc", "--db", db_path, "--vacuum", cwd=tmp_path, timeout_s=60)
    assert (0, "") == (done.returncode, done.stderr)
    assert "database file" in done.stdout
    assert os.path.getsize(db_path) < plain.file_bytes_after // 4
    with sqlite3.connect(db_path) as conn:
        assert 2 == conn.execute("PRAGMA auto_vacuum").fetchone()[0]
