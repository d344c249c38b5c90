"""A library is silent until its app asks (docs/design.md §13): events go through ``logging``."""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
from sessions import ROOT, rag_turn, run_cli

from ragent_memory.core.logs import EVENT_ATTR, get_logger

# 100 compacting turns driven by an app that only configured ``logging``.
SCRIPT = """
import logging, random, sys
logging.basicConfig(level=getattr(logging, sys.argv[1]))
from ragent_memory import MemoryEngine, Settings
sys.path.insert(0, "tests")
from sessions import rag_turn
rng = random.Random(7)
history = [{"role": "system", "content": "You are a support agent."}]
settings = Settings(context_window_chars=20_000, store={"path": sys.argv[2]})
with MemoryEngine(settings) as engine:
    for turn in range(100):
        user, *rest = rag_turn(turn, rng)
        history.append(user)
        engine.prepare(history, session_id="s1", user_id="u1")
        history.extend(rest)
        engine.after_turn(history, session_id="s1", user_id="u1")
    engine.flush()
"""


def _drive(level: str, db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, level, str(db)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _applied(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        (count,) = conn.execute(
            "select count(*) from compactions where status = 'applied'"
        ).fetchone()
    return int(count)


@pytest.mark.slow
def test_app_with_warning_logging_sees_nothing_on_stdout(tmp_path: Path) -> None:
    """100 compacting turns under basicConfig(WARNING) print nothing at all."""
    db = tmp_path / "quiet.db"
    done = _drive("WARNING", db)
    assert 0 == done.returncode, done.stderr
    assert _applied(db) >= 3
    assert "" == done.stdout
    assert "compaction.applied" not in done.stderr


@pytest.mark.slow
def test_app_with_info_logging_receives_events_through_logging(tmp_path: Path) -> None:
    """With INFO the engine's events arrive through the app's logging handler (stderr here)."""
    db = tmp_path / "loud.db"
    done = _drive("INFO", db)
    assert 0 == done.returncode, done.stderr
    assert "" == done.stdout
    applied = [
        line
        for line in done.stderr.splitlines()
        if re.match(r"INFO:ragent_memory\.[\w.]+:compaction\.applied ", line)
    ]
    assert _applied(db) == len(applied)
    assert "session_id='s1'" in applied[0]


@pytest.fixture(autouse=True)
def unconfigured_structlog() -> None:
    """As in an app that never configured structlog (other tests' ``capture_logs`` do)."""
    structlog.reset_defaults()


def test_event_fields_ride_on_the_log_record(caplog: pytest.LogCaptureFixture) -> None:
    """A structured handler finds the event and its fields on the record, not only as text."""
    caplog.set_level(logging.INFO, logger="ragent_memory")
    get_logger("ragent_memory.engine.memory_engine").info(
        "trim.applied", session_id="s1", trimmed=3
    )
    (record,) = caplog.records
    assert "ragent_memory.engine.memory_engine" == record.name
    assert "trim.applied session_id='s1' trimmed=3" == record.getMessage()
    assert {"event": "trim.applied", "session_id": "s1", "trimmed": 3} == getattr(
        record, EVENT_ATTR
    )


def test_level_below_the_logger_threshold_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    """``getLogger('ragent_memory').setLevel(ERROR)`` silences warnings of every module."""
    caplog.set_level(logging.ERROR, logger="ragent_memory")
    get_logger("ragent_memory.engine.compaction").warning(
        "compaction.skipped", reason="no_safe_cut"
    )
    assert [] == caplog.records


def test_every_module_logs_through_the_logging_module() -> None:
    """No module builds its own structlog logger (it would bypass ``logging``)."""
    package = ROOT / "ragent_memory"
    offenders = [
        str(path.relative_to(ROOT))
        for path in package.rglob("*.py")
        if path.name != "logs.py" and "structlog.get_logger" in path.read_text(encoding="utf-8")
    ]
    assert [] == offenders


def test_cli_renders_engine_events_as_json_lines_on_stderr(tmp_path: Path) -> None:
    """``ragent-memory --json -v compact`` shows the events as JSON on stderr, none on stdout."""
    import random

    rng = random.Random(3)
    messages = [m for turn in range(30) for m in rag_turn(turn, rng)]
    transcript = tmp_path / "t.json"
    transcript.write_text(json.dumps(messages), encoding="utf-8")
    config = tmp_path / "c.yaml"
    config.write_text("context_window_chars: 20000\n", encoding="utf-8")
    out = tmp_path / "out.json"
    done = run_cli(
        "--json", "-v", "compact", str(transcript), "--config", str(config),
        "--db", str(tmp_path / "m.db"), "--out", str(out),
    )  # fmt: skip
    assert 0 == done.returncode, done.stderr
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    applied = [e for e in events if "compaction.applied" == e["event"]]
    assert applied and "info" == applied[0]["level"] and "session_id" in applied[0]
    assert "compaction.applied" not in done.stdout
