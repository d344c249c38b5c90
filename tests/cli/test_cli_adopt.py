"""The CLI as a first-time user meets it: compact's store, one-line errors naming the file,
``--json`` on either side of the subcommand, ``init``, the demo's ``--db``/``--chart``."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from sessions import rag_turn, run_cli


@pytest.fixture
def transcript(tmp_path: Path) -> Path:
    rng = random.Random(5)
    path = tmp_path / "t.json"
    path.write_text(json.dumps([m for t in range(80) for m in rag_turn(t, rng)]))
    return path


def _turns(stdout: str) -> list[dict[str, object]]:
    """The per-turn reports of a compact run, without their timings."""
    return [{k: v for k, v in t.items() if k != "duration_ms"} for t in json.loads(stdout)["turns"]]


def _config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(f"context_window_chars: 20000\n{extra}")
    return path


def test_compact_defaults_to_a_temporary_store_and_repeats_exactly(
    transcript: Path, tmp_path: Path
) -> None:
    """Without --db nothing lands in the working directory and two runs agree."""
    first, second = (run_cli("compact", str(transcript), cwd=tmp_path) for _ in range(2))
    assert 0 == first.returncode, first.stderr
    assert re.search(r"store: .*compact\.db \(temporary", first.stderr)
    assert _turns(first.stdout) == _turns(second.stdout)
    assert ["t.json"] == sorted(p.name for p in tmp_path.iterdir())


def test_compact_keeps_the_session_in_db_under_the_given_session(
    transcript: Path, tmp_path: Path
) -> None:
    """``--db`` and ``--session`` decide where and under which id the audit rows go."""
    db = tmp_path / "kept.db"
    config = _config(tmp_path)
    done = run_cli("compact", str(transcript), "--config", str(config), "--db", str(db),
                   "--session", "replay-1")  # fmt: skip
    assert 0 == done.returncode, done.stderr
    rows = json.loads(run_cli("audit", "--db", str(db), "--json").stdout)
    assert rows and {"replay-1"} == {r["session_id"] for r in rows}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["compact", "{t}", "--db", "{d}/missing/x.db"], "{d}/missing/x.db: directory"),
        (["compact", "{d}/latin1.json"], "{d}/latin1.json: not UTF-8 text (byte 2 is 0xe9)"),
        (["inspect", "--config", "{d}/bad.yaml"], "{d}/bad.yaml: invalid YAML at line 2 column 1"),
        (["compact", "{t}", "--config", "{d}/bad.yaml"], "{d}/bad.yaml: invalid YAML"),
        (["init", "{d}/missing/c.yaml"], "{d}/missing/c.yaml: directory"),
        (["init", "{t}"], "{t} already exists"),
    ],
)
def test_user_errors_are_one_line_naming_the_file(
    transcript: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    """Exit 2, one line on stderr naming the file, nothing created."""
    (tmp_path / "latin1.json").write_bytes(b"[{\xe9]")  # Latin-1, not UTF-8
    (tmp_path / "bad.yaml").write_text("context_window_chars: [1\n")
    fill = {"t": str(transcript), "d": str(tmp_path)}
    done = run_cli(*(a.format(**fill) for a in args), cwd=tmp_path)
    assert 2 == done.returncode
    assert 1 == len(done.stderr.strip().splitlines()), done.stderr
    assert message.format(**fill) in done.stderr
    assert not (tmp_path / "missing").exists()


def test_json_before_or_after_the_subcommand(transcript: Path, tmp_path: Path) -> None:
    """``--json audit`` and ``audit --json`` print the same rows; so do inspect and memory list."""
    db = tmp_path / "a.db"
    run_cli("compact", str(transcript), "--config", str(_config(tmp_path)), "--db", str(db),
            "--user", "u1")  # fmt: skip
    for command in (["audit", "--db", str(db)], ["inspect"], ["memory", "list", "--user", "u1", "--db", str(db)]):  # fmt: skip
        after = run_cli(*command, "--json", cwd=tmp_path)
        before = run_cli("--json", *command, cwd=tmp_path)
        assert 0 == after.returncode == before.returncode, before.stderr
        assert json.loads(after.stdout) == json.loads(before.stdout)


def test_init_writes_the_documented_config_that_loads(tmp_path: Path) -> None:
    """``init`` writes config/ragent-memory.yaml; inspect reads it; a second init refuses."""
    done = run_cli("init", cwd=tmp_path)
    assert 0 == done.returncode, done.stderr
    assert (tmp_path / "config" / "ragent-memory.yaml").is_file()
    shown = json.loads(run_cli("inspect", "--json", cwd=tmp_path).stdout)
    assert 1_200_000 == shown["context_window_chars"]
    again = run_cli("init", cwd=tmp_path)
    assert 2 == again.returncode and "already exists" in again.stderr


@pytest.mark.slow
def test_demo_writes_db_and_chart_where_asked(tmp_path: Path) -> None:
    """``demo --db --chart`` puts the store and the PNG at the given paths."""
    db, chart = tmp_path / "d.db", tmp_path / "c.png"
    done = run_cli("demo", "--turns", "60", "--out", str(tmp_path / "out"), "--db", str(db),
                   "--chart", str(chart), cwd=tmp_path)  # fmt: skip
    assert 0 == done.returncode, done.stderr
    assert db.is_file()
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
