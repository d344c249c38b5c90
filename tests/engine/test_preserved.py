"""Preserved tool outputs (docs/design.md §6): a loaded skill is carried verbatim, never summarized."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sessions import run_session

from ragent_memory import Settings
from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.summary.preserved import render_preserved, update_preserved

SKILL = (
    "SKILL refund-playbook v7. Step 1: confirm the order id. Step 2: check the 30-day window. "
    "Step 3: refunds above 250 euros need a supervisor. Step 4: never promise a date. "
    "Step 5: log the case in the CRM with tag RFND-7731. End of playbook."
)


def skill_turn(call_id: str, name: str, text: str) -> list[dict[str, Any]]:
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": text},
    ]


def test_latest_result_per_preserved_tool() -> None:
    """Only preserved tools are kept, one entry each, the newest result wins."""
    material = list(
        enumerate(
            [
                *skill_turn("a", "load_skill", "old skill"),
                *skill_turn("b", "search_knowledge", "a finding"),
                *skill_turn("c", "load_skill", "new skill"),
            ]
        )
    )
    entries = update_preserved((), material, ("load_skill",))
    assert entries == ({"tool": "load_skill", "i": 5, "text": "new skill"},)
    assert update_preserved(entries, [], ("load_skill",)) == entries
    assert update_preserved((), material, ()) == ()


def test_long_result_clipped_head_and_tail_within_budget() -> None:
    text = "HEAD " + "x" * 5000 + " TAIL"
    block = render_preserved(
        [{"tool": "load_skill", "i": 1, "text": text}], budget=400, language="en"
    )
    assert len(block) <= 400
    assert block.startswith("## Preserved tool outputs\n### load_skill\nHEAD ")
    assert block.endswith(" TAIL") and "chars omitted" in block


@pytest.mark.both_backends  # the carried state is a store column on both
def test_skill_survives_compactions_and_restart(
    make_settings: Callable[..., Settings],
) -> None:
    """A skill loaded in turn 1 is verbatim in the view after 3 compactions and a restart,
    and is carried on by a compaction after the restart."""
    settings = make_settings(context_window_chars=20_000, preserved_tools=["load_skill"])
    assert len(SKILL) < settings.preserved_max_chars - 60
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a support agent."},
        {"role": "user", "content": "Load the refund playbook, please."},
        *skill_turn("skill1", "load_skill", SKILL),
        {"role": "assistant", "content": "Loaded."},
    ]
    with MemoryEngine(settings) as engine:
        history = run_session(engine, 100, history=history)
        history.append({"role": "user", "content": "and now?"})
        before = engine.prepare(history, session_id="s1", user_id="u1")
    assert before.report.generation >= 3
    assert SKILL in before.messages[1]["content"]  # the summary message, after the summary
    assert before.messages[1]["content"].index(SKILL) > before.messages[1]["content"].index("##")
    with MemoryEngine(settings) as engine:
        after = engine.prepare(history, session_id="s1", user_id="u1")
        assert SKILL in after.messages[1]["content"]
        history = run_session(engine, 40, history=history, seed=2)
        history.append({"role": "user", "content": "and later?"})
        later = engine.prepare(history, session_id="s1", user_id="u1")
    assert later.report.generation > before.report.generation
    assert SKILL in later.messages[1]["content"]
