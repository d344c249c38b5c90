"""Reduction: oversized tool results and tool-call inputs become head + notice + tail previews
(pure-function tables, then through the engine on a real SQLite file)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from sessions import tool_loop, user

from ragent_memory import Settings
from ragent_memory.core.toolloops import map_loops
from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.gates.reduce import ARGUMENTS_KEY, preview, reduce
from ragent_memory.recall.refs import FOOTER_MARK, RECALL_TOOL_NAME, find_refs


def text(n: int, seed: int = 0) -> str:
    """``n`` chars in which every slice is distinguishable from its neighbours."""
    return "".join(
        chr(0x41 + (i * 7 + seed) % 26) + ("\n" if i % 97 == 96 else "") for i in range(n)
    )[:n]


def call(call_id: str, name: str, arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def recall_all(engine: MemoryEngine, session_id: str, ref: str) -> str:
    """The whole original behind ``ref``, read in one call (the footer split off)."""
    answer = engine.recall(session_id, ref, 0, 10**9)
    piece, mark, _ = answer.rpartition(FOOTER_MARK)
    assert FOOTER_MARK == mark, answer
    return piece


def fake_ref(text: str) -> str:
    return f"rm-{len(text):020x}"


# ---------------------------------------------------------------------------- pure function


@pytest.mark.parametrize(
    ("language", "notice"),
    [
        (
            "en",
            "\n…[9700 of 10000 chars omitted here; to read them call "
            'recall_tool_result(ref="rm-1", offset=200)]…\n',
        ),
        (
            "zh",
            '\n…[此处省略 9700 字符（原长 10000 字符）；调用 recall_tool_result(ref="rm-1", offset=200) 可继续读取]…\n',
        ),
    ],
)
def test_preview_is_head_notice_tail(language: str, notice: str) -> None:
    """A preview is 20% of the limit from the head, the notice, then 10% from the tail."""
    original = text(10_000)
    expected = original[:200] + notice + original[-100:]
    assert expected == preview(original, limit_chars=1_000, language=language, ref="rm-1")


def test_results_at_or_under_the_limit_are_left_alone() -> None:
    """Only results longer than the limit are reduced."""
    view = [user("q"), *tool_loop("a", "x" * 4_000, name="export")]
    result = reduce(view, limit_chars=4_000, language="en", ref_for=fake_ref)
    assert view == result.messages
    assert () == result.previews


def test_oversized_result_becomes_a_preview_and_input_is_untouched() -> None:
    """The oversized result is replaced; the caller's list and dicts are not mutated."""
    view = [user("q"), *tool_loop("a", text(9_000), name="export")]
    before = copy.deepcopy(view)
    result = reduce(view, limit_chars=4_000, language="en", ref_for=fake_ref)
    assert before == view
    (made,) = result.previews
    assert (2, (fake_ref(view[2]["content"]),)) == (made.index, made.refs)
    assert (view[2]["content"],) == made.offloaded
    assert {**view[2], "content": result.messages[2]["content"]} == result.messages[2]
    assert result.messages[2]["content"].startswith(view[2]["content"][:800] + "\n…[")


def test_list_content_keeps_its_non_text_parts() -> None:
    """A multi-part result keeps its images; only the text becomes a preview."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    parts = [{"type": "text", "text": "a" * 3_000}, image, {"type": "text", "text": "b" * 3_000}]
    view = [user("q"), *tool_loop("a", "", name="export")]
    view[2] = {**view[2], "content": parts}
    result = reduce(view, limit_chars=4_000, language="en", ref_for=fake_ref)
    content = result.messages[2]["content"]
    assert image == content[1]
    assert ("a" * 3_000 + "\n" + "b" * 3_000,) == result.previews[0].offloaded


def test_results_of_the_recall_tool_are_never_reduced() -> None:
    """A recall result is the original read back; reducing it would loop."""
    view = [
        user("q"),
        *tool_loop("r", "x" * 50_000, name=RECALL_TOOL_NAME, arguments='{"ref": "rm-1"}'),
    ]
    assert () == reduce(view, limit_chars=4_000, language="en", ref_for=fake_ref).previews


def test_a_recall_result_is_known_by_its_own_call_wherever_it_stands() -> None:
    """Each result is matched to the call it answers, the nearest before it carrying its id
    (or after it, out of order): a recall result after parallel calls stays whole, another
    tool's result beside it is reduced, and so is a result whose id no call carries."""
    big = "x" * 50_000
    parallel = {
        "role": "assistant",
        "content": None,
        "tool_calls": [call("s1", "search_knowledge"), call("r1", RECALL_TOOL_NAME)],
    }
    view = [
        user("q"),
        parallel,
        {"role": "tool", "tool_call_id": "s1", "content": big},
        {"role": "tool", "tool_call_id": "r1", "content": big},
        {"role": "tool", "tool_call_id": "r2", "content": big},  # answered out of order
        {"role": "assistant", "content": None, "tool_calls": [call("r2", RECALL_TOOL_NAME)]},
        {"role": "tool", "tool_call_id": "nobody", "content": big},
    ]
    reduced = reduce(view, limit_chars=4_000, language="en", ref_for=fake_ref)
    assert [2, 6] == [t.index for t in reduced.previews]


def test_oversized_arguments_become_a_json_preview() -> None:
    """An oversized call input is wrapped as a JSON object; id, name and the other calls stay."""
    big = json.dumps({"rows": text(9_000)})
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [call("a", "upload", big), call("b", "search_knowledge", '{"q": 1}')],
    }
    result = reduce([user("q"), message], limit_chars=4_000, language="en", ref_for=fake_ref)
    calls = result.messages[1]["tool_calls"]
    assert ["a", "b"] == [c["id"] for c in calls]
    assert ["upload", "search_knowledge"] == [c["function"]["name"] for c in calls]
    assert message["tool_calls"][1] == calls[1]
    shown = json.loads(calls[0]["function"]["arguments"])
    assert [ARGUMENTS_KEY] == list(shown)
    assert preview(big, limit_chars=4_000, language="en", ref=fake_ref(big)) == shown[ARGUMENTS_KEY]
    assert (big,) == result.previews[0].offloaded


# ---------------------------------------------------------------------------- through the engine


def test_200k_result_at_400k_budget_is_a_short_preview(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """At B = 400,000 (limit 20,000) a 200,000-char result shows ≤ 20,000 chars plus notice,
    counted as truncated, and its ref reads the original back exactly."""
    original = text(200_000)
    engine = make_engine(make_settings(context_window_chars=400_000))
    history = [user("export it"), *tool_loop("a", original, name="export"), user("thanks")]
    prepared = engine.prepare(history, session_id="s")
    shown = prepared.messages[2]["content"]
    (ref,) = find_refs(shown)
    head, notice, tail = shown[:4_000], shown[4_000:-2_000], shown[-2_000:]
    assert (original[:4_000], original[-2_000:]) == (head, tail)
    assert notice.startswith("\n…[194000 of 200000 chars omitted")
    assert f'{RECALL_TOOL_NAME}(ref="{ref}", offset=4000)]…\n' in notice
    assert len(shown) - len(notice) <= 20_000
    assert 1 == prepared.report.truncated
    assert original == recall_all(engine, "s", ref)
    assert history[0] == prepared.messages[0]
    assert history[3] == prepared.messages[3]


def test_reduction_runs_below_the_trim_trigger(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """Reduction is applied before the gates: it needs no gate to fire."""
    engine = make_engine(make_settings(context_window_chars=400_000))
    prepared = engine.prepare(
        [user("q"), *tool_loop("a", text(30_000), name="export")], session_id="s"
    )
    assert (1, 0) == (prepared.report.truncated, prepared.report.trimmed)
    assert prepared.report.chars_out < 30_000 < prepared.report.chars_in


def test_previews_are_sticky_across_turns_and_restarts(
    make_settings: Callable[..., Settings],
) -> None:
    """A later turn, and a new engine on the same store, show the very same preview."""
    settings = make_settings(context_window_chars=100_000)
    history = [user("q"), *tool_loop("a", text(30_000), name="export"), user("next")]
    with MemoryEngine(settings) as engine:
        first = engine.prepare(history, session_id="s")
        second = engine.prepare([*history, user("more")], session_id="s")
    with MemoryEngine(settings) as engine:
        third = engine.prepare([dict(m) for m in history], session_id="s")
    assert json.dumps(first.messages) == json.dumps(second.messages[: len(first.messages)])
    assert first.messages == third.messages


def test_zh_notice_is_used_with_language_zh(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """With language: zh the notice is the Chinese one."""
    engine = make_engine(make_settings(context_window_chars=100_000, language="zh"))
    prepared = engine.prepare(
        [user("导出"), *tool_loop("a", "数据" * 5_000, name="export")], session_id="s"
    )
    shown = prepared.messages[2]["content"]
    (ref,) = find_refs(shown)
    assert f'…[此处省略 8500 字符（原长 10000 字符）；调用 recall_tool_result(ref="{ref}"' in shown
    assert "omitted" not in shown


def test_oversized_arguments_through_the_engine(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """Oversized call inputs: id and name unchanged, arguments a JSON object with the preview,
    the original recallable, and every call still answered by its result."""
    big = json.dumps({"document": text(12_000)})
    engine = make_engine(make_settings(context_window_chars=100_000))
    history = [
        user("store this"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("a", "save_doc", big), call("b", "search_knowledge")],
        },
        {"role": "tool", "tool_call_id": "a", "content": "saved"},
        {"role": "tool", "tool_call_id": "b", "content": "found"},
        user("ok"),
    ]
    prepared = engine.prepare(history, session_id="s")
    calls = prepared.messages[1]["tool_calls"]
    assert [("a", "save_doc"), ("b", "search_knowledge")] == [
        (c["id"], c["function"]["name"]) for c in calls
    ]
    shown = json.loads(calls[0]["function"]["arguments"])[ARGUMENTS_KEY]
    (ref,) = find_refs(shown)
    assert big == recall_all(engine, "s", ref)
    loops = map_loops(prepared.messages)
    assert all(lp.is_complete for lp in loops.loops)
    assert frozenset() == loops.orphan_indexes
    assert 1 == prepared.report.truncated
    assert history[2:] == prepared.messages[2:]


def test_oversized_recall_results_are_not_reduced_again(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings], db_path: str
) -> None:
    """A recall result over the limit is sent whole and not offloaded a second time."""
    engine = make_engine(make_settings(context_window_chars=100_000))
    history = [user("q"), *tool_loop("a", text(30_000), name="export")]
    ref = find_refs(engine.prepare(history, session_id="s").messages[2]["content"])[0]
    answer = engine.recall("s", ref, 0, 20_000)
    history += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                call("r", RECALL_TOOL_NAME, json.dumps({"ref": ref, "offset": 0, "limit": 20_000}))
            ],
        },
        {"role": "tool", "tool_call_id": "r", "content": answer},
    ]
    prepared = engine.prepare(history, session_id="s")
    assert answer == prepared.messages[-1]["content"]
    assert 1 == prepared.report.truncated
    rows = engine.store.db.execute("SELECT COUNT(*) FROM offloads").fetchone()[0]
    assert 1 == rows


def test_lone_surrogates_are_offloaded_and_recalled_exactly(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """A result with a lone surrogate (valid str, invalid UTF-8) still reduces and recalls."""
    original = "\ud800" + text(9_000) + "\udfff"
    engine = make_engine(make_settings(context_window_chars=40_000))
    prepared = engine.prepare([user("q"), *tool_loop("a", original, name="export")], session_id="s")
    (ref,) = find_refs(prepared.messages[2]["content"])
    assert 1 == prepared.report.truncated
    assert original == recall_all(engine, "s", ref)
