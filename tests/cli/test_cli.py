"""The CLI as users run it: a real subprocess of ``python -m ragent_memory``."""

from __future__ import annotations

import json
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sessions import ROOT, rag_turn, run_cli, without_recall


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd)


def transcript(turns: int) -> list[dict[str, Any]]:
    rng = random.Random(3)
    out: list[dict[str, Any]] = [{"role": "user", "content": "Never exceed 4,321 euros."}]
    for t in range(turns):
        out += rag_turn(t, rng)
    out.append({"role": "user", "content": "final question"})
    return out


def test_inspect_shows_the_shipped_gates() -> None:
    """`inspect` prints the derived gates of the shipped config."""
    result = cli("inspect", "--config", "config/ragent-memory.yaml")
    assert 0 == result.returncode, result.stderr
    for number in ("1,200,000", "600,000", "960,000", "240,000", "6,000"):
        assert number in result.stdout


def test_inspect_json(tmp_path: Path) -> None:
    """`inspect --json` prints the numbers for another budget."""
    config = tmp_path / "c.yaml"
    config.write_text("context_window_chars: 20000\n")
    result = cli("inspect", "--config", str(config), "--json")
    assert 0 == result.returncode, result.stderr
    data = json.loads(result.stdout)
    assert 2_000 == data["summary_max_chars"]
    assert 1_500 == data["memory_max_chars"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["inspect", "--config", "missing.yaml"], "cannot read config"),
        (["audit", "--db", "missing.db"], "no store"),
    ],
)
def test_user_errors_exit_2_with_one_line(args: list[str], fragment: str, tmp_path: Path) -> None:
    """User errors exit 2 with one line on stderr, no traceback."""
    result = cli(*args, cwd=tmp_path)
    assert 2 == result.returncode
    assert fragment in result.stderr
    assert 1 == len(result.stderr.strip().splitlines())


def test_bad_config_key_exits_2(tmp_path: Path) -> None:
    """A config error names the key path."""
    config = tmp_path / "c.yaml"
    config.write_text("store: {pth: x.db}\n")
    result = cli("inspect", "--config", str(config))
    assert 2 == result.returncode
    assert "store.pth" in result.stderr


def test_compact_single_line_jsonl(tmp_path: Path) -> None:
    """A JSONL file holding one message is a one-turn transcript."""
    path = tmp_path / "one.jsonl"
    path.write_text('{"role": "user", "content": "hi"}\n')
    result = cli("compact", str(path), "--db", str(tmp_path / "x.db"))
    assert 0 == result.returncode, result.stderr
    assert [{"role": "user", "content": "hi"}] == json.loads(result.stdout)["messages"]


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_compact_and_audit(tmp_path: Path, fmt: str) -> None:
    """`compact FILE` replays a transcript turn by turn; `audit` then lists the generations."""
    messages = transcript(80)
    path = tmp_path / f"t.{fmt}"
    if fmt == "json":
        path.write_text(json.dumps(messages))
    else:
        path.write_text("\n".join(json.dumps(m) for m in messages))
    config = tmp_path / "c.yaml"
    db = tmp_path / "a.db"
    config.write_text(f"context_window_chars: 20000\nstore: {{path: {db}}}\n")
    out = tmp_path / "out.json"
    result = cli(
        "compact", str(path), "--config", str(config), "--session", "t1", "--out", str(out)
    )
    assert 0 == result.returncode, result.stderr
    data = json.loads(out.read_text())
    assert messages[-1] == without_recall(data["messages"][-1])
    assert 82 == len(data["turns"])
    assert data["turns"][-1]["generation"] >= 1
    audit = cli("audit", "--db", str(db), "--session", "t1", "--json")
    rows = json.loads(audit.stdout)
    assert rows and {"applied"} == {r["status"] for r in rows}
    assert {None} == {r["user_id"] for r in rows}  # no --user
    lines = cli("audit", "--db", str(db), "--session", "t1", "--jsonl").stdout.splitlines()
    assert rows == [json.loads(line) for line in lines]
    table = cli("audit", "--db", str(db))
    assert "applied" in table.stdout


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ('[{"role": "user", "content": "a"}, ', "invalid JSON"),
        ('{"role": "user"}\n{oops}\n', "line 2"),
        ('[{"role": "wizard", "content": "a"}]', "messages[0]: unknown role"),
        ("", "empty"),
    ],
)
def test_compact_malformed_file_exits_2(tmp_path: Path, content: str, fragment: str) -> None:
    """A malformed transcript exits 2 with one line naming the problem."""
    path = tmp_path / "bad.json"
    path.write_text(content)
    result = cli("compact", str(path), "--db", str(tmp_path / "x.db"))
    assert 2 == result.returncode
    assert fragment in result.stderr
    assert 1 == len(result.stderr.strip().splitlines())


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["compact"], "Missing argument 'FILE'"),
        (["nosuch"], "No such command"),
        (["inspect", "--bogus"], "No such option"),
    ],
)
def test_usage_errors_are_one_line(args: list[str], fragment: str) -> None:
    """Usage errors exit 2 with one line, like every user error."""
    result = cli(*args)
    assert 2 == result.returncode
    assert fragment in result.stderr
    assert 1 == len(result.stderr.strip().splitlines())


def test_compact_missing_file_exits_2(tmp_path: Path) -> None:
    """A missing transcript file is a user error."""
    result = cli("compact", str(tmp_path / "nope.json"))
    assert 2 == result.returncode
    assert "nope.json" in result.stderr


# ---------------------------------------------------------------------------- logging, --user


@dataclass(frozen=True)
class Compacted:
    """One `compact` run over a transcript that compacts, and the store it wrote."""

    file: Path
    config: Path
    db: Path
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def compacted(tmp_path_factory: pytest.TempPathFactory) -> Compacted:
    """`--json -v compact --user u7` over 30 RAG turns at B=20,000 (trims, then compacts)."""
    root = tmp_path_factory.mktemp("compacted")
    file, config, db = root / "t.json", root / "c.yaml", root / "a.db"
    file.write_text(json.dumps(transcript(30)))
    config.write_text(f"context_window_chars: 20000\nstore: {{path: {db}}}\n")
    result = cli("--json", "-v", "compact", str(file), "--config", str(config), "--user", "u7")
    assert 0 == result.returncode, result.stderr
    return Compacted(file, config, db, result)


def events(stderr: str) -> list[dict[str, Any]]:
    """The log lines on stderr, each parsed as one JSON object."""
    return [json.loads(line) for line in stderr.splitlines()]


def test_global_json_and_verbose_log_events_as_json_lines(compacted: Compacted) -> None:
    """`--json -v` puts the engine's info events on stderr, one JSON object per line."""
    names = {e["event"] for e in events(compacted.result.stderr)}
    assert {"trim.applied", "compaction.applied"} <= names
    assert "messages" in json.loads(compacted.result.stdout)  # stdout stays the result alone


def test_without_verbose_info_events_stay_hidden(compacted: Compacted, tmp_path: Path) -> None:
    """Without -v only warnings and errors are logged: the same run shows no info event."""
    db = tmp_path / "quiet.db"
    result = cli(
        "--json", "compact", str(compacted.file), "--config", str(compacted.config), "--db", str(db)
    )
    assert 0 == result.returncode, result.stderr
    assert [] == [e for e in events(result.stderr) if e["level"] == "info"]


def test_without_json_events_are_for_a_terminal(compacted: Compacted, tmp_path: Path) -> None:
    """`-v` alone logs the same events, rendered for people rather than as JSON."""
    result = cli(
        "-v",
        "compact",
        str(compacted.file),
        "--config",
        str(compacted.config),
        "--db",
        str(tmp_path / "console.db"),
    )
    assert 0 == result.returncode, result.stderr
    lines = [line for line in result.stderr.splitlines() if "compaction.applied" in line]
    assert lines
    for line in lines:
        with pytest.raises(ValueError):
            json.loads(line)


def test_compact_user_is_recorded(compacted: Compacted) -> None:
    """`compact --user` runs the session as that user: the audit rows carry the id."""
    rows = json.loads(cli("audit", "--db", str(compacted.db), "--json").stdout)
    assert rows and {"u7"} == {r["user_id"] for r in rows}


def test_audit_summaries_prints_each_applied_summary(compacted: Compacted) -> None:
    """`audit --summaries` adds every applied summary under its generation; plain audit not."""
    rows = json.loads(cli("audit", "--db", str(compacted.db), "--json").stdout)
    with_summaries = cli("audit", "--db", str(compacted.db), "--summaries")
    plain = cli("audit", "--db", str(compacted.db))
    assert (0, 0) == (with_summaries.returncode, plain.returncode)
    for row in rows:
        block = f"#{row['id']} summary (generation {row['generation']}):\n{row['summary']}"
        assert block in with_summaries.stdout
        assert row["summary"] not in plain.stdout
