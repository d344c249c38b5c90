"""`ragent-memory demo`, the main job, as a user runs it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sessions import run_cli


def test_demo_runs_every_gate_offline(tmp_path: Path) -> None:
    """The demo trims, truncates, compacts, recalls, learns facts and leaves an audit DB."""
    out = tmp_path / "out"
    result = run_cli("demo", "--turns", "120", "--out", str(out), cwd=tmp_path)
    assert 0 == result.returncode, result.stderr
    text = result.stdout
    for line in (
        "trim gate (50%)",
        "compaction gate (80%)",
        "recall loop",
        "engine.recall →",
        "long-term memory: 3 facts learned",
        "Works at Northwind Support",
    ):
        assert line in text
    rows = (
        sqlite3.connect(out / "demo.db")
        .execute("SELECT status FROM compactions WHERE session_id = 'demo'")
        .fetchall()
    )
    assert rows and {("applied",)} == set(rows)


def test_demo_rejects_a_bad_config(tmp_path: Path) -> None:
    """A bad config is a one-line user error."""
    config = tmp_path / "c.yaml"
    config.write_text("context_window_chars: 10\n")
    result = run_cli("demo", "--config", str(config), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert 2 == result.returncode
    assert "context_window_chars" in result.stderr
