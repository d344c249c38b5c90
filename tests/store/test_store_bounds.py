"""What the store bounds: the length of an id and how often it is kept, and who may read the
store's files."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_openai import FakeOpenAI
from serve_process import ProxyProcess, write_config

from ragent_memory import InvalidIdError, InvalidMessagesError, MemoryEngine, Settings
from ragent_memory.store import Store

LONG_ID = "u" * 100_000
MESSAGES = [
    {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(199)
]


def engine_on(path: Path, **overrides: Any) -> MemoryEngine:
    return MemoryEngine(Settings(store={"path": str(path)}, **overrides))


@pytest.mark.parametrize(
    ("session_id", "user_id", "field", "problem"),
    [
        ("s" * 257, None, "session_id", "257 characters, over the limit of 256 (max_id_chars)"),
        ("s", "u" * 300, "user_id", "300 characters, over the limit of 256 (max_id_chars)"),
        ("s\ud800x", None, "session_id", "not valid text: a lone surrogate at index 1"),
        ("s", "u\udfff", "user_id", "not valid text: a lone surrogate at index 1"),
        ("a\x00b", None, "session_id", "not valid text: NUL at index 1"),
        ("", None, "session_id", "must be a non-empty string, got ''"),
        (7, None, "session_id", "must be a non-empty string, got 7"),
    ],
)
def test_a_bad_id_is_refused_naming_its_field_before_anything_is_written(
    tmp_path: Path, session_id: Any, user_id: Any, field: str, problem: str
) -> None:
    """prepare and after_turn refuse a bad id with an InvalidIdError (a ValueError) naming
    the field and what is wrong; the store holds nothing of it."""
    with engine_on(tmp_path / "m.db") as engine:
        for call in (engine.prepare, engine.after_turn):
            with pytest.raises(InvalidIdError) as caught:
                call(MESSAGES[:1], session_id=session_id, user_id=user_id)
            assert (field, f"{field}: {problem}") == (caught.value.field, str(caught.value))
            assert isinstance(caught.value, InvalidMessagesError | ValueError)
        engine.flush()
        with engine.store._locked("test"):
            kept = [
                engine.store.db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                for table in ("ids", "sessions", "recall_messages", "memory_pending")
            ]
    assert [0, 0, 0, 0] == kept


def test_max_id_chars_moves_the_limit(tmp_path: Path) -> None:
    """The limit is the setting's: 40 characters refused at 32, taken at 64."""
    with (
        engine_on(tmp_path / "a.db", max_id_chars=32) as engine,
        pytest.raises(InvalidIdError, match="over the limit of 32"),
    ):
        engine.prepare(MESSAGES[:1], session_id="s" * 40)
    with engine_on(tmp_path / "b.db", max_id_chars=64) as engine:
        assert engine.prepare(MESSAGES[:1], session_id="s" * 40).messages == MESSAGES[:1]


def growth(path: Path, session_id: str, user_id: str) -> int:
    """Bytes the store grows by for one turn of 199 messages and its after_turn."""
    with engine_on(path, max_id_chars=200_000) as engine:
        engine.prepare(MESSAGES[:1], session_id="warm", user_id="warm")
        engine.flush()
        engine.store._truncate_wal()  # type: ignore[attr-defined]
        before = engine.store.file_bytes()  # type: ignore[attr-defined]
        engine.prepare(MESSAGES, session_id=session_id, user_id=user_id)
        engine.after_turn(MESSAGES, session_id=session_id, user_id=user_id)
        engine.flush()
        engine.store._truncate_wal()  # type: ignore[attr-defined]
        return int(engine.store.file_bytes()) - before  # type: ignore[attr-defined]


def test_a_long_id_is_kept_once_not_per_message(tmp_path: Path) -> None:
    """A 100,000-character id with 199 messages (its index, pending and seen rows) grows the
    store by about the id once more than a short id does (it grew by 204.6 MB when every row
    and six indexes kept the id)."""
    short = growth(tmp_path / "short.db", "s", "u")
    long = growth(tmp_path / "long.db", LONG_ID, LONG_ID)
    assert long - short < 3 * len(LONG_ID), (short, long)
    assert long < 1_000_000


def test_the_proxy_refuses_a_long_or_invalid_id_with_a_400_naming_it(tmp_path: Path) -> None:
    """A 100 KB ``user`` field, a session id with a NUL and one with a lone surrogate (valid
    JSON, no valid text) get a 400 naming the field (and the limit) from the proxy, and the
    store keeps nothing of any."""
    config = write_config(tmp_path, "ids", budget=20_000)
    body = {"model": "m", "messages": MESSAGES[:1]}
    with FakeOpenAI() as upstream, ProxyProcess(config, upstream.base_url, cwd=tmp_path) as proxy:
        url = f"{proxy.base_url}/chat/completions"
        long = httpx.post(url, json={**body, "user": LONG_ID}, headers={"X-Session-Id": "s"})
        nul = httpx.post(url, json={**body, "user": "a\x00b"})
        lone = httpx.post(
            url,
            content=b'{"model": "m", "user": "s\\ud800x", "messages": [{"role": "user", "content": "hi"}]}',
            headers={"Content-Type": "application/json"},
        )
        assert [] == upstream.requests
    assert 400 == long.status_code
    assert "user_id: 100000 characters, over the limit of 256" in long.json()["error"]["message"]
    assert 400 == nul.status_code
    assert "session_id: not valid text: NUL at index 1" in nul.json()["error"]["message"]
    assert 400 == lone.status_code
    assert "user (read as the session_id): not valid text" in lone.json()["error"]["message"]
    with sqlite3.connect(tmp_path / "ids.db") as conn:
        assert [(0,)] == conn.execute("SELECT COUNT(*) FROM ids").fetchall()
    conn.close()


OPEN_WITH_UMASK_0 = """
import os, sys
os.umask(0)
from ragent_memory.store import AuditRow, Store
with Store(sys.argv[1]) as store:
    store.audit(AuditRow(session_id="s", generation=1, status="failed"))
    store.claim_compaction("s")
    here = os.path.dirname(sys.argv[1])
    for name in sorted(os.listdir(here)):  # while open: the -wal and -shm go at the close
        print(name, oct(os.stat(os.path.join(here, name)).st_mode & 0o777))
"""


def test_the_store_and_its_side_files_are_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    """With umask 0 the store's directories it creates are 0700, the file, -wal and -shm
    0600: the store holds every conversation, the facts and the scope secrets."""
    path = tmp_path / "made" / "here" / "m.db"
    done = subprocess.run(
        [sys.executable, "-c", OPEN_WITH_UMASK_0, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    modes = dict(line.split() for line in done.stdout.splitlines())
    assert dict.fromkeys(["m.db", "m.db-shm", "m.db-wal"], "0o600") == modes
    assert 0o600 == path.stat().st_mode & 0o777
    assert [0o700, 0o700] == [d.stat().st_mode & 0o777 for d in (path.parent.parent, path.parent)]


def test_an_existing_directory_keeps_its_mode(tmp_path: Path) -> None:
    """Only directories the store creates are made owner-only; one that exists is the
    owner's to set."""
    tmp_path.chmod(0o755)
    Store(tmp_path / "m.db").close()
    assert 0o755 == tmp_path.stat().st_mode & 0o777
    assert 0o600 == os.stat(tmp_path / "m.db").st_mode & 0o777
