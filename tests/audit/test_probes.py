"""Fidelity probes: each identifier and user constraint of the messages a generation covered is
kept (in its summary), recallable (a recall search for its context finds it) or lost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sessions import run_cli

from ragent_memory import MemoryEngine, Settings, StoreSettings
from ragent_memory.audit import probe_session
from ragent_memory.audit.probes import items
from ragent_memory.core.records import AuditRow

# The session: raw positions 0..7. The generation planted below covers 1..6.
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You plan events for the team."},
    {"role": "user", "content": "Book the venue. Never spend more than 4,200 euros on catering."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "book", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "Booking reference QX-7781 confirmed."},
    {"role": "user", "content": "The loading dock permit is PP-5531 for the van drivers."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c2", "type": "function", "function": {"name": "lock", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c2", "content": "ZK-9090"},
    {"role": "user", "content": "What is next?"},
]
CONSTRAINT = "Never spend more than 4,200 euros on catering."
# Kept: the summary holds these verbatim. PP-5531 is not in it, but a search for "loading dock
# permit van drivers" finds its message; ZK-9090 is a tool result with no words around it to
# ask with, and the summary dropped it: lost.
SUMMARY = (
    "## User requests\n- Book the venue. Never spend more than 4,200 euros on catering.\n"
    "## Tools and findings\n- booking QX-7781 confirmed\n## Done\n- venue booked"
)
EXPECTED = {
    ("identifier", "4,200 euros"): "kept",
    ("constraint", CONSTRAINT): "kept",
    ("identifier", "QX-7781"): "kept",
    ("identifier", "PP-5531"): "recallable",
    ("identifier", "ZK-9090"): "lost",
}


def _planted(tmp_path: Path, summary: str = SUMMARY) -> tuple[MemoryEngine, str]:
    """A real store holding the session's raw text (indexed by the engine, as every turn
    does) and one applied generation over messages 1..6 with ``summary``."""
    db = str(tmp_path / "probes.db")
    engine = MemoryEngine(Settings(context_window_chars=60_000, store=StoreSettings(path=db)))
    engine.prepare(HISTORY, session_id="s1", user_id="u1")
    engine.after_turn(HISTORY, session_id="s1", user_id="u1")
    assert engine.flush(timeout_s=60)
    engine.store.audit(
        AuditRow(
            session_id="s1",
            user_id="u1",
            generation=1,
            status="applied",
            reason="over_trigger",
            written_by="model",
            material_messages=6,
            summary=summary,
            summary_chars=len(summary),
            covered_from=1,
            covered_to=7,
        )
    )
    return engine, db


def test_each_planted_item_is_kept_recallable_or_lost_as_planted(tmp_path: Path) -> None:
    """Items in the summary are kept, one only a recall search finds is recallable, one with
    nothing to ask by and missing from the summary is lost; the totals count them."""
    engine, _ = _planted(tmp_path)
    with engine:
        found = probe_session(engine.store, engine.settings, "s1")
    (generation,) = found.generations
    assert EXPECTED == {(p.kind, p.item): p.outcome for p in generation.probes}
    assert {"kept": 3, "recallable": 1, "lost": 1} == found.totals()
    positions = {p.item: p.position for p in generation.probes}
    assert {"PP-5531": 4, "ZK-9090": 6, "QX-7781": 3} == {
        k: positions[k] for k in ("PP-5531", "ZK-9090", "QX-7781")
    }


def test_the_question_leaves_the_item_out(tmp_path: Path) -> None:
    """The recall question is built from the item's context without the item itself."""
    engine, _ = _planted(tmp_path)
    with engine:
        (generation,) = probe_session(engine.store, engine.settings, "s1").generations
    for probe in generation.probes:
        assert probe.item.casefold() not in probe.question.casefold()
    permit = next(p for p in generation.probes if p.item == "PP-5531")
    assert "loading dock permit" in permit.question


def test_a_summary_that_drops_everything_leaves_only_recall(tmp_path: Path) -> None:
    """With a summary holding none of the items, what the search finds is recallable and the
    rest lost; nothing is counted kept."""
    engine, _ = _planted(tmp_path, summary="## Done\n- nothing kept")
    with engine:
        found = probe_session(engine.store, engine.settings, "s1")
    totals = found.totals()
    assert 0 == totals["kept"]
    assert len(EXPECTED) == totals["recallable"] + totals["lost"]
    assert "lost" == {p.item: p.outcome for p in found.generations[0].probes}["ZK-9090"]


def test_a_row_without_its_range_says_so(tmp_path: Path) -> None:
    """An audit row written before ranges were recorded has no probes and a note."""
    engine, _ = _planted(tmp_path)
    with engine:
        engine.store.audit(AuditRow(session_id="s2", generation=1, status="applied", summary="x"))
        (generation,) = probe_session(engine.store, engine.settings, "s2").generations
    assert () == generation.probes
    assert "does not record" in generation.note


def test_items_come_once_each_from_their_first_mention() -> None:
    """An identifier repeated later is probed once, at its first message."""
    from ragent_memory.core.records import IndexedMessage

    covered = [
        IndexedMessage("s", 1, "tool", "Ticket T-4411 opened for Dana Reyes."),
        IndexedMessage("s", 2, "assistant", "I will follow T-4411 for Dana Reyes."),
    ]
    found = [(p.item, p.position) for p in items(covered)]
    assert [("T-4411", 1), ("Dana Reyes", 1)] == found


def test_probe_cli_prints_the_counts_as_json(tmp_path: Path) -> None:
    """`ragent-memory probe --json` reports the same counts per generation and in total."""
    engine, db = _planted(tmp_path)
    engine.close()
    result = run_cli("probe", "--db", db, "--session", "s1", "--json")
    assert 0 == result.returncode, result.stderr
    report = json.loads(result.stdout)
    assert {"kept": 3, "recallable": 1, "lost": 1} == report["totals"]
    assert [{"kept": 3, "recallable": 1, "lost": 1}] == [g["counts"] for g in report["generations"]]
    table = run_cli("probe", "--db", db, "--session", "s1")
    assert "3 kept, 1 recallable, 1 lost" in table.stdout
    assert "'ZK-9090' (message #6, tool)" in table.stdout


@pytest.mark.parametrize("args", [("--session", "nobody"), ()])
def test_probe_cli_on_a_session_without_generations(tmp_path: Path, args: tuple[str, ...]) -> None:
    """A session with no applied compaction says so; --session is required."""
    engine, db = _planted(tmp_path)
    engine.close()
    result = run_cli("probe", "--db", db, *args)
    if args:
        assert 0 == result.returncode
        assert "no applied compaction recorded for session nobody" in result.stdout
    else:
        assert 2 == result.returncode
        assert "--session" in result.stderr
