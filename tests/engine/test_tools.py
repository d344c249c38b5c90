"""The engine's tools as a model calls them: untrusted arguments, one text answer, no raise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ragent_memory import MemoryEngine
from ragent_memory.engine.tools import as_int, call_tool, parse_arguments
from ragent_memory.recall.refs import find_refs


@pytest.mark.parametrize(
    ("value", "expected"), [("8000", 8000), (" 12 ", 12), (3.0, 3), (3.5, 3.5), ("x", "x"), (7, 7)]
)
def test_as_int_coerces_only_what_is_clearly_an_integer(value: Any, expected: Any) -> None:
    """Digit strings and integral floats become ints; anything else is left for refusal."""
    assert expected == as_int(value)


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"ref": "a"}', {"ref": "a"}),
        ({"ref": "a"}, {"ref": "a"}),
        ("", {}),
        ("[1]", None),
        ("{", None),
    ],
)
def test_parse_arguments_reads_json_or_mappings(arguments: Any, expected: Any) -> None:
    """JSON text or a mapping gives a dict; anything else None."""
    assert expected == parse_arguments(arguments)


@pytest.mark.parametrize(
    ("name", "arguments", "start"),
    [
        ("recall_tool_result", "{", "[recall_tool_result: arguments must be a JSON object"),
        ("recall_tool_result", {"offset": 3}, '[recall: "ref" is required'),
        ("recall_tool_result", {"ref": 42}, '[recall: "ref" is required'),
        ("recall_tool_result", {"ref": "rm-0", "reason": "x"}, "[recall: ref 'rm-0' not found"),
        ("recall_tool_result", {"ref": "rm-0", "limit": "ten"}, "[recall: ref 'rm-0' not found"),
        ("search_memory", {"limit": 3}, '[search_memory: "query" is required'),
        ("search_memory", {"query": "x", "limit": "ten"}, "[search_memory: limit must be"),
        ("search_memory", {"query": "x", "limit": "3", "why": 1}, "[search_memory: nothing found"),
        ("delete_everything", {}, "[delete_everything: not a ragent_memory tool]"),
    ],
)
def test_call_tool_answers_every_call_in_one_line(
    make_engine: Callable[..., MemoryEngine], name: str, arguments: Any, start: str
) -> None:
    """Bad, extra or missing arguments get a one-line refusal, never an exception."""
    answer = call_tool(make_engine(), name, arguments, session_id="s1")
    assert answer.startswith(start)
    assert "\n" not in answer


def test_recall_reads_back_with_coerced_arguments_and_extra_keys(
    make_engine: Callable[..., MemoryEngine],
) -> None:
    """A model sending ``limit`` as text and an undeclared key still reads the original."""
    engine = make_engine()
    body = "x" * 60_000 + "END"
    history = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "fetch", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": body},
    ]  # fmt: skip
    prepared = engine.prepare(history, session_id="s1")
    (ref,) = {r for m in prepared.messages for r in find_refs(str(m.get("content")))}
    answer = call_tool(
        engine,
        "recall_tool_result",
        {"ref": ref, "offset": "60000", "limit": 3.0, "why": "x"},
        session_id="s1",
    )
    assert answer.startswith("END")
    assert answer == engine.recall("s1", ref, offset="60000", limit=3.0, why="x")  # type: ignore[arg-type]
