"""The audit page over HTTP (`ragent-memory ui` as a subprocess): its pages, the token, the
scope, escaping, and forgetting one fact only through the confirmed form."""

from __future__ import annotations

import json
import re
import sqlite3
import urllib.parse
from pathlib import Path

import pytest
from sessions import run_cli
from ui_process import HOSTILE, SCOPE_A, SCOPE_B, UiProcess, copy_store, demo_store

from ragent_memory.ui.chart import context_chart


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_store(tmp_path_factory.mktemp("ui-demo"))


@pytest.fixture(scope="module")
def page(demo_db: Path) -> UiProcess:
    with UiProcess("--db", str(demo_db), "--session", "demo") as running:
        yield running


def _facts(db: Path, status: str = "active") -> list[tuple[int, str]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT id, content FROM memories WHERE kind = 'fact' AND status = ? ORDER BY id",
            [status],
        ).fetchall()
    conn.close()
    return rows


def test_ready_line_names_the_session_page(page: UiProcess) -> None:
    """With --session the ready line is that session's page address."""
    assert page.shown.endswith("/session?id=demo")
    assert page.shown.startswith("http://127.0.0.1:")


def test_the_demo_ends_with_the_command_that_opens_its_session(demo_db: Path) -> None:
    """The demo's last line is a `ragent-memory ui` command; run as printed, its page is the
    demo session's."""
    last = (demo_db.parent / "demo-stdout.txt").read_text(encoding="utf-8").splitlines()[-1]
    command = last.split(": ", 1)[1].split()
    assert ["ragent-memory", "ui", "--db", str(demo_db), "--session", "demo"] == command
    with UiProcess(*command[2:]) as ui:
        status, body = ui.get(ui.shown.removeprefix(ui.url))
    assert 200 == status
    assert "Session demo" in body


def test_every_page_answers(page: UiProcess) -> None:
    """The sessions, a session, what survived, a message and a user's facts are pages."""
    for path, needle in (
        ("/", "demo-user"),
        ("/session?id=demo", "Context per turn"),
        ("/probes?session=demo", 'id="totals"'),
        ("/message?session=demo&position=1", 'id="content"'),
        ("/user?id=demo-user", 'id="facts"'),
    ):
        status, body = page.get(path)
        assert (200, True) == (status, needle in body), path


def test_session_page_shows_each_generation_and_its_probes(page: UiProcess, demo_db: Path) -> None:
    """Every audit row of the session is a generation block; probes are counted on it and the
    totals match `ragent-memory probe`."""
    with sqlite3.connect(demo_db) as conn:
        rows = conn.execute("SELECT COUNT(*) FROM compactions WHERE session_id = 'demo'").fetchone()
    conn.close()
    _, body = page.get("/session?id=demo")
    assert rows[0] >= 1
    assert rows[0] == body.count('class="generation"')
    assert "<svg" in body and 'class="compaction"' in body
    probe = run_cli("probe", "--db", str(demo_db), "--session", "demo", "--json")
    totals = json.loads(probe.stdout)["totals"]
    _, survived = page.get("/probes?session=demo")
    shown = re.search(r'id="totals">.*?(\d+) kept.*?(\d+) recallable.*?(\d+) lost', survived, re.S)
    assert shown is not None
    assert [totals["kept"], totals["recallable"], totals["lost"]] == [
        int(g) for g in shown.groups()
    ]


def test_markup_in_a_message_is_shown_as_text(page: UiProcess) -> None:
    """What the user wrote is escaped, never run."""
    sid = urllib.parse.quote(f"{SCOPE_A}:alpha")
    status, body = page.get(f"/message?session={sid}&position=0")
    assert 200 == status
    assert "<script>" not in body
    assert "&lt;script&gt;" in body
    assert HOSTILE not in body


def test_unknown_and_malformed_addresses_are_pages_not_crashes(page: UiProcess) -> None:
    """An unknown session is a 404 page, a missing or bad parameter a 400 page."""
    assert 404 == page.get("/session?id=nobody")[0]
    assert 400 == page.get("/session")[0]
    assert 400 == page.get("/message?session=demo&position=x")[0]
    assert 404 == page.get("/forget?user=demo-user&fact=999999")[0]


def test_forget_needs_the_forms_key(demo_db: Path, tmp_path: Path) -> None:
    """A POST without the confirmation form's key forgets nothing; with it, only that fact."""
    db = copy_store(demo_db, tmp_path / "copy.db")
    before = _facts(db)
    assert len(before) >= 2
    target = before[0][0]
    with UiProcess("--db", str(db)) as running:
        form = urllib.parse.urlencode({"user": "demo-user", "fact": target, "key": "guess"})
        status, _ = running.request("POST", "/forget", data=form.encode())
        assert 403 == status
        assert before == _facts(db)
        _, confirm = running.get(f"/forget?user=demo-user&fact={target}")
        key = re.search(r'name="key" value="([^"]+)"', confirm)
        assert key is not None
        form = urllib.parse.urlencode({"user": "demo-user", "fact": target, "key": key.group(1)})
        status, _ = running.request("POST", "/forget", data=form.encode())
        assert 303 == status
    assert before[1:] == _facts(db)


def test_a_token_guards_every_page(demo_db: Path) -> None:
    """With --token-env each request needs the token: bearer, or ?token= once (a cookie)."""
    env = {"RAGENT_UI_TEST_TOKEN": "s3cret-token-value"}
    with UiProcess("--db", str(demo_db), "--token-env", "RAGENT_UI_TEST_TOKEN", env=env) as ui:
        assert 401 == ui.get("/")[0]
        assert 401 == ui.get("/", {"Authorization": "Bearer wrong"})[0]
        assert 200 == ui.get("/", {"Authorization": "Bearer s3cret-token-value"})[0]
        status, _ = ui.get("/?token=s3cret-token-value")
        assert 303 == status
        assert 200 == ui.get("/", {"Cookie": "ragent_memory_ui=s3cret-token-value"})[0]
        assert "s3cret" not in ui.ready_line


def test_beyond_loopback_needs_a_token(demo_db: Path) -> None:
    """Listening on another interface without --token-env is refused, with the reason."""
    result = run_cli("ui", "--db", str(demo_db), "--host", "0.0.0.0", "--port", "0")
    assert 2 == result.returncode
    assert "--token-env" in result.stderr


def test_one_scope_shows_only_its_sessions(demo_db: Path) -> None:
    """Started with --scope, the page lists and opens only that scope's sessions and users."""
    with UiProcess("--db", str(demo_db), "--scope", SCOPE_A) as ui:
        _, listing = ui.get("/")
        assert f"{SCOPE_A}:alpha" in listing
        assert f"{SCOPE_B}:beta" not in listing
        assert ">demo<" not in listing
        beta = urllib.parse.quote(f"{SCOPE_B}:beta")
        assert 404 == ui.get(f"/session?id={beta}")[0]
        assert 404 == ui.get("/session?id=demo")[0]
        assert 404 == ui.get("/user?id=demo-user")[0]


def test_chart_is_escaped_svg_with_the_gates() -> None:
    """The chart is an SVG with the raw history, what was sent, B and its two gates."""
    turns = [
        {"turn": n, "chars_raw": 1000 * n, "chars_out": 800 * n, "budget_chars": 10_000}
        | {"compacted": n == 5, "trimmed": n // 3, "generation": int(n >= 5)}
        for n in range(1, 9)
    ]
    svg = context_chart(turns)
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert 2 == svg.count("<polyline")
    assert 1 == svg.count('class="compaction"')
    assert 2 == svg.count('class="trim"')
    assert {"budget B", "compact 80%", "trim 50%"} <= set(re.findall(r">([^<>]+)</text>", svg))
    assert "" == context_chart([])
