"""The recall tool: its schema, exact slices with a footer, clear refusals, and refs that
read back exactly what every placeholder and preview stands for."""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sessions import rag_turn, tool_loop, without_recall
from strategies import conversations

from ragent_memory import RagentMemoryError, Settings, StoreError, StoreSettings
from ragent_memory.core.chars import text_of
from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.gates.reduce import ARGUMENTS_KEY
from ragent_memory.gates.trim import PLACEHOLDERS
from ragent_memory.recall.refs import (
    DEFAULT_LIMIT,
    FOOTER_MARK,
    RECALL_TOOL_NAME,
    find_refs,
    recall_tool_schema,
)

# The engine end to end on both stores (docs/design.md §10: one contract, the same suite).
pytestmark = pytest.mark.both_backends

ORIGINAL = "".join(f"{i:07d}|" for i in range(25_000))  # 200,000 chars, every slice unique


def export(call_id: str, result: str) -> list[dict[str, Any]]:
    return tool_loop(call_id, result, name="export")


def offload(engine: MemoryEngine, session_id: str, original: str = ORIGINAL) -> str:
    """Show ``original`` as an oversized result in ``session_id``; return its recall ref."""
    history = [{"role": "user", "content": "export"}, *export("a", original)]
    (ref,) = find_refs(engine.prepare(history, session_id=session_id).messages[2]["content"])
    return ref


@pytest.fixture
def engine(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> MemoryEngine:
    return make_engine(make_settings(context_window_chars=400_000))


def split_footer(answer: str, expected_chars: int) -> tuple[str, str]:
    return answer[:expected_chars], answer[expected_chars:]


# ---------------------------------------------------------------------------- the schema


def test_schema_is_recall_tool_result_ref_offset_limit(engine: MemoryEngine) -> None:
    """The engine offers recall_tool_result(ref, offset=0, limit=8000) as an OpenAI tool."""
    schema = engine.recall_tool()
    function = schema["function"]
    parameters = function["parameters"]
    assert ("function", RECALL_TOOL_NAME) == (schema["type"], function["name"])
    assert ["ref"] == parameters["required"]
    assert {"ref", "offset", "limit"} == set(parameters["properties"])
    assert (0, DEFAULT_LIMIT) == (
        parameters["properties"]["offset"]["default"],
        parameters["properties"]["limit"]["default"],
    )
    assert 8_000 == DEFAULT_LIMIT
    assert schema == json.loads(json.dumps(recall_tool_schema()))


# ---------------------------------------------------------------------------- slices


@pytest.mark.parametrize(
    ("offset", "limit"),
    [
        (0, 1),
        (0, 8_000),
        (4_000, 10),
        (12_345, 54_321),
        (190_000, 10_000),  # exactly the last slice
        (195_000, 8_000),  # the last slice, shorter than the limit
        (199_999, 5),
        (0, 10**9),
    ],
)
def test_recall_returns_exactly_the_slice(engine: MemoryEngine, offset: int, limit: int) -> None:
    """recall(session, ref, k, n) is original[k:k+n], then a footer saying what remains."""
    ref = offload(engine, "s")
    expected = ORIGINAL[offset : offset + limit]
    piece, footer = split_footer(engine.recall("s", ref, offset, limit), len(expected))
    assert expected == piece
    end = offset + len(expected)
    if end < len(ORIGINAL):
        want = (
            f"{FOOTER_MARK}chars {offset}–{end} of 200000; {200_000 - end} remain, "
            f"call again with offset={end}]"
        )
    else:
        want = f"{FOOTER_MARK}end of text, chars {offset}–200000 of 200000]"
    assert want == footer


def test_default_limit_is_8000(engine: MemoryEngine) -> None:
    """Without offset and limit the first 8,000 chars come back."""
    ref = offload(engine, "s")
    piece, footer = split_footer(engine.recall("s", ref), 8_000)
    assert ORIGINAL[:8_000] == piece
    assert footer.startswith(FOOTER_MARK + "chars 0–8000 of 200000; 192000 remain")


def test_paging_by_the_footer_reads_the_whole_original(engine: MemoryEngine) -> None:
    """A model following the footer's next offset reads the original back whole."""
    ref = offload(engine, "s")
    pages, offset = [], 0
    while True:
        piece, _, footer = engine.recall("s", ref, offset, 30_000).rpartition(FOOTER_MARK)
        pages.append(piece)
        step = re.search(r"offset=(\d+)\]$", footer)
        if step is None:
            break
        offset = int(step.group(1))
    assert ORIGINAL == "".join(pages)
    assert 7 == len(pages)


def test_a_ref_survives_a_restart(make_settings: Callable[..., Settings]) -> None:
    """Offloads live in the store: a new engine on the same file still recalls them."""
    settings = make_settings(context_window_chars=400_000)
    with MemoryEngine(settings) as engine:
        ref = offload(engine, "s")
    with MemoryEngine(settings) as engine:
        assert ORIGINAL[:100] == engine.recall("s", ref, 0, 100)[:100]


# ---------------------------------------------------------------------------- refusals


def not_found(ref: object) -> str:
    return f"[recall: ref {ref!r} not found in this session (unknown, expired or dropped)]"


def test_a_ref_from_another_session_is_not_found(engine: MemoryEngine) -> None:
    """Another session's ref reads as unknown — the same text as a ref that never existed."""
    ref = offload(engine, "s")
    offload(engine, "t", ORIGINAL[::-1])
    assert not_found(ref) == engine.recall("t", ref)
    assert not_found(ref) == engine.recall("t", ref, 0, 10**9)


@pytest.mark.parametrize(
    "ref",
    ["rm-0123456789abcdef0123", "rm-", "", "../offloads", "' OR 1=1 --", None, 42, ["rm-x"]],
)
def test_unknown_refs_are_not_found(engine: MemoryEngine, ref: Any) -> None:
    """A random or malformed ref gets the not-found text, never an exception."""
    offload(engine, "s")
    assert not_found(ref) == engine.recall("s", ref)


def test_refs_are_bound_to_their_session_and_store(
    make_engine: Callable[..., MemoryEngine], tmp_path: Path
) -> None:
    """The same text has different refs in different sessions and in different stores."""
    one, two = (
        make_engine(Settings(context_window_chars=400_000, store=StoreSettings(str(path))))
        for path in (tmp_path / "a.db", tmp_path / "b.db")
    )
    refs = {offload(one, "s"), offload(one, "t"), offload(two, "s")}
    assert 3 == len(refs)
    assert offload(one, "s") in refs  # stable within a store and session


@pytest.mark.parametrize(
    ("offset", "limit", "expected"),
    [
        (-1, 10, "[recall: offset must be an integer ≥ 0, got -1]"),
        ("three", 10, "[recall: offset must be an integer ≥ 0, got 'three']"),
        (1.5, 10, "[recall: offset must be an integer ≥ 0, got 1.5]"),
        (True, 10, "[recall: offset must be an integer ≥ 0, got True]"),
        (None, 10, "[recall: offset must be an integer ≥ 0, got None]"),
        (0, 0, "[recall: limit must be an integer ≥ 1, got 0]"),
        (0, -5, "[recall: limit must be an integer ≥ 1, got -5]"),
        (0, "ten", "[recall: limit must be an integer ≥ 1, got 'ten']"),
        (
            200_000,
            10,
            "[recall: offset 200000 is past the end; the text has 200000 chars, "
            "use an offset below 200000]",
        ),
        (
            10**12,
            10,
            f"[recall: offset {10**12} is past the end; the text has 200000 chars, "
            "use an offset below 200000]",
        ),
    ],
)
def test_bad_offsets_and_limits_read_as_clear_text(
    engine: MemoryEngine, offset: Any, limit: Any, expected: str
) -> None:
    """A bad offset or limit gets one line saying what is wrong, not an exception."""
    ref = offload(engine, "s")
    assert expected == engine.recall("s", ref, offset, limit)


def test_a_store_failure_reads_as_clear_text(
    engine: MemoryEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the store cannot be read the model still gets an answer to its call."""
    ref = offload(engine, "s")

    def broken(session_id: str, ref: str) -> str:
        raise StoreError("disk I/O error")

    monkeypatch.setattr(engine.store, "read_offload", broken)
    assert "[recall: the store could not be read just now; try again later]" == engine.recall(
        "s", ref
    )


def test_recall_on_a_closed_engine_raises(engine: MemoryEngine) -> None:
    """Using a closed engine is a programming error, not something for the model to read."""
    ref = offload(engine, "s")
    engine.close()
    with pytest.raises(RagentMemoryError, match="closed"):
        engine.recall("s", ref)


# ---------------------------------------------------------------------------- every ref reads back


def shown_refs(view: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
    """(index, ref, kind) for every ref the model can see in tool results and call inputs
    (the recall block's own refs, to excerpts of other messages, aside)."""
    out = []
    for index, message in enumerate(view):
        for ref in find_refs(text_of(without_recall(message))):
            out.append((index, ref, "result"))
        for call in message.get("tool_calls") or ():
            for ref in find_refs(call["function"]["arguments"]):
                out.append((index, ref, call["id"]))
    return out


def original_of(raw: dict[str, Any], kind: str) -> str:
    if kind == "result":
        return text_of(raw)
    (call,) = [c for c in raw["tool_calls"] if c["id"] == kind]
    return str(call["function"]["arguments"])


def raw_of(history: list[dict[str, Any]], shown: dict[str, Any]) -> dict[str, Any]:
    """The caller's message ``shown`` stands for, by its call ids (positions move when the
    ceiling leaves old turns out of the view)."""
    if shown.get("role") == "tool":
        return next(
            m
            for m in history
            if m.get("role") == "tool" and m.get("tool_call_id") == shown["tool_call_id"]
        )
    ids = [c["id"] for c in shown["tool_calls"]]
    return next(m for m in history if [c["id"] for c in m.get("tool_calls") or ()] == ids)


def recall_whole(engine: MemoryEngine, session_id: str, ref: str) -> str:
    piece, mark, _ = engine.recall(session_id, ref, 0, 10**9).rpartition(FOOTER_MARK)
    assert FOOTER_MARK == mark
    return piece


@pytest.mark.parametrize("language", ["en", "zh"])
def test_every_placeholder_of_a_long_session_recalls_its_original(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings], language: str
) -> None:
    """Over a long RAG session, every placeholder and preview ever shown carries a ref that
    recalls exactly the result it replaced."""
    engine = make_engine(
        make_settings(context_window_chars=20_000, summary_enabled=False, language=language)
    )
    rng = random.Random(7)
    history: list[dict[str, Any]] = [{"role": "system", "content": "persona"}]
    checked: set[str] = set()
    placeholders, previews = set(), set()
    placeholder_start = PLACEHOLDERS[language].split("{")[0]
    for turn in range(60):
        messages = rag_turn(turn, rng)
        if turn % 9 == 8:  # now and then an oversized result too
            messages[2] = {**messages[2], "content": messages[2]["content"] * 4}
        history += messages
        prepared = engine.prepare(history, session_id="s")
        assert len(history) == len(prepared.messages)  # no summary: view index = raw index
        for index, ref, kind in shown_refs(prepared.messages):
            is_placeholder = prepared.messages[index]["content"].startswith(placeholder_start)
            (placeholders if is_placeholder else previews).add(ref)
            if ref not in checked:
                assert original_of(history[index], kind) == recall_whole(engine, "s", ref)
                checked.add(ref)
    assert (True, True) == (len(placeholders) > 30, len(previews) > 3)
    assert placeholders | previews == checked


@given(conversations(max_turns=10), st.sampled_from([8_000, 12_000]))
def test_every_ref_in_a_prepared_view_recalls_the_raw_message(
    tmp_path_factory: pytest.TempPathFactory, history: list[dict[str, Any]], budget: int
) -> None:
    """For any conversation, each ref shown recalls the raw text it stands for, exactly."""
    db = str(tmp_path_factory.mktemp("db") / "m.db")
    history = copy.deepcopy(history)
    if history:  # one oversized call input, to cover previews of arguments too
        history.insert(0, {"role": "user", "content": "go"})
        history[1:1] = [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "big",
                        "type": "function",
                        "function": {"name": "upload", "arguments": json.dumps({"x": "y" * 9_000})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "big", "content": "ok"},
        ]
    settings = Settings(context_window_chars=budget, summary_enabled=False, store=StoreSettings(db))
    with MemoryEngine(settings) as engine:
        prepared = engine.prepare(history, session_id="s")
        for index, ref, kind in shown_refs(prepared.messages):
            raw = raw_of(history, prepared.messages[index])
            assert original_of(raw, kind) == recall_whole(engine, "s", ref)
            if kind != "result":
                shown = prepared.messages[index]["tool_calls"][0]["function"]["arguments"]
                assert [ARGUMENTS_KEY] == list(json.loads(shown))
