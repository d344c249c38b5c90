"""The reliability suite: what an attacker would try, bounded so it runs in
`make test`.

- ≥ 2,000 generated histories (budgets 8k–80k, long tool loops, huge results and inputs):
  every output ≤ B unless what is left is the system prompt and the current turn (then
  ``over_budget``), no orphan or unanswered call, the system prompt and the first user
  message kept (verbatim, summarized or left out by the ceiling), the input never mutated.
- Hypothesis over arbitrary JSON-like values: only InvalidMessagesError escapes.
- ≥ 30 SIGKILLs of a child at random moments (mid-compaction, mid-extraction): integrity ok,
  every applied generation has exactly one audit row, and the child resumes.
- Two processes on one SQLite file: nothing reaches the caller, no compaction fails.
- 8 threads × 50 sessions give the sequential results.
- Hostile stores: full (``max_page_count``) and its directory deleted mid-run.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sessions import without_recall

from ragent_memory import Settings, StoreSettings
from ragent_memory.core.chars import Message
from ragent_memory.core.toolloops import last_user_index, map_loops
from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.errors import InvalidMessagesError

pytestmark = pytest.mark.slow

WORKLOAD = Path(__file__).resolve().parents[1] / "workload.py"
HISTORIES = int(os.environ.get("RELIABILITY_HISTORIES", "2000"))
BUDGETS = (8_000, 10_000, 16_000, 30_000, 80_000)
TOOLS = ("search_knowledge", "run_sql", "export")


# ---------------------------------------------------------------------------- generated


_WORDS = ("alpha", "beta", "gamma", "delta", "订单", "refund", "id-42", "deadline")
_CORPUS = " ".join(random.Random(0).choice(_WORDS) for _ in range(60_000))


def text(rng: random.Random, size: int) -> str:
    """``size`` chars of mixed English/Chinese words, from a random place in one corpus."""
    start = rng.randrange(len(_CORPUS) // 2)
    out = _CORPUS[start : start + size]
    while len(out) < size:
        out += " " + _CORPUS[: size - len(out) - 1]
    return out


def result_size(rng: random.Random, budget: int) -> int:
    roll = rng.random()
    if roll < 0.6:
        return rng.randint(0, 800)
    if roll < 0.9:
        return rng.randint(800, 4_000)
    return rng.randint(4_000, int(budget * 1.5))


def loop(rng: random.Random, budget: int, number: int) -> list[Message]:
    calls, results = [], []
    for k in range(rng.randint(1, 3)):
        call_id = f"c{number}_{k}"
        arguments = json.dumps({"q": text(rng, rng.randint(0, 60))})
        if rng.random() < 0.03:
            arguments = json.dumps({"body": text(rng, rng.randint(1_000, budget // 2))})
        function = {"name": rng.choice(TOOLS), "arguments": arguments}
        calls.append({"id": call_id, "type": "function", "function": function})
        size = result_size(rng, budget)
        results.append({"role": "tool", "tool_call_id": call_id, "content": text(rng, size)})
    content = text(rng, rng.randint(0, 80)) if rng.random() < 0.3 else None
    return [{"role": "assistant", "content": content, "tool_calls": calls}, *results]


def growing_history(rng: random.Random, budget: int) -> Iterator[list[Message]]:
    """One generated session, yielded at every point an agent calls the model."""
    history: list[Message] = []
    if rng.random() < 0.85:
        history.append({"role": "system", "content": text(rng, rng.randint(20, budget // 8))})
    number = 0
    for turn in range(rng.randint(1, 8)):
        size = rng.randint(5, 300) if rng.random() < 0.9 else rng.randint(300, budget // 3)
        history.append({"role": "user", "content": f"q{turn} " + text(rng, size)})
        yield history
        loops = rng.randint(0, 3) if rng.random() < 0.93 else rng.randint(8, 20)
        for _ in range(loops):
            history.extend(loop(rng, budget, number))
            number += 1
            yield history
        if rng.random() < 0.7:
            history.append({"role": "assistant", "content": text(rng, rng.randint(10, 1_500))})


def check(
    messages: list[Message], out: list[Message], report: Any, budget: int, stats: Counter[str]
) -> None:
    loops = map_loops(out)
    assert not loops.orphan_indexes, "orphan tool result"
    assert all(loop.is_complete for loop in loops.loops), "unanswered or duplicate call"
    if messages and messages[0].get("role") == "system":
        assert messages[0] == out[0], "system prompt lost"
    first = next((m for m in messages if m.get("role") == "user"), None)
    if first is not None:
        assert first in out or report.generation or report.dropped_turns, "first user lost"
    if report.over_budget:
        stats["over_budget"] += 1
        turn = last_user_index(messages)
        current = messages[turn:] if turn >= 0 else [m for m in messages if m["role"] != "system"]
        rest = [m for m in out if m.get("role") != "system"]
        assert len(rest) == len(current), "over B with more than the current turn left"
        assert report.recalled_chars == 0, "a recall block on a turn over B"
    else:
        assert report.chars_out + report.recalled_chars <= budget, "over B without over_budget"
    # chars_out counts the blocks kept on earlier turns (a joining newline each), not the
    # current turn's block (recalled_chars, on the last message)
    current = len(out) - 1 if report.recalled_chars else None
    kept, shown = 0, []
    for index, message in enumerate(out):
        own = without_recall(message)
        if own is not message and index != current:
            kept += len(message["content"][0]["text"]) + 1
        shown.append(own)
    assert report.chars_out == kept + sum(
        len(m.get("content") or "") if isinstance(m.get("content"), str) else 0 for m in shown
    ) + sum(
        len(c["function"]["name"]) + len(c["function"]["arguments"] or "")
        for m in out
        for c in m.get("tool_calls") or ()
    )
    stats["calls"] += 1
    stats["dropped_turns"] += report.dropped_turns
    stats[f"skipped:{report.skipped_reason}"] += 1
    stats["max_permille_of_b"] = max(stats["max_permille_of_b"], report.chars_out * 1000 // budget)


def test_generated_histories_keep_every_invariant(tmp_path: Path) -> None:
    """≥ 2,000 generated histories: 0 outputs over B except irreducible ones (reported
    over_budget), 0 invariant breaks, the input never mutated."""
    rng = random.Random(8)
    stats: Counter[str] = Counter()
    engines = {
        budget: MemoryEngine(
            Settings(
                context_window_chars=budget,
                store=StoreSettings(path=str(tmp_path / f"b{budget}.db")),
                long_term_enabled=False,
            )
        )
        for budget in BUDGETS
    }
    try:
        for number in range(HISTORIES):
            budget = rng.choice(BUDGETS)
            engine = engines[budget]
            pristine: list[Message] = []
            history: list[Message] = []
            for history in growing_history(rng, budget):
                pristine.extend(copy.deepcopy(history[len(pristine) :]))
                prepared = engine.prepare(history, session_id=f"h{number}")
                check(history, prepared.messages, prepared.report, budget, stats)
                if prepared.report.compacted:  # the audit says what this turn sent
                    rows = engine.store.compactions(f"h{number}")
                    applied = [r for r in rows if r["status"] == "applied"][-1]
                    assert prepared.report.chars_out == applied["chars_after"]
                    stats["compactions"] += 1
            assert pristine == history[: len(pristine)], "the caller's messages were mutated"
            engine.drop_session(f"h{number}")
    finally:
        for engine in engines.values():
            engine.close()
    print("\nreliability.generated", HISTORIES, "histories", dict(stats))
    assert stats["calls"] >= 20_000


def generated(number: int) -> tuple[int, Iterator[list[Message]]]:
    """The budget and the calls of history ``number`` of the generated histories above."""
    rng = random.Random(8)
    for _ in range(number):
        for _history in growing_history(rng, rng.choice(BUDGETS)):
            pass
    budget = rng.choice(BUDGETS)
    return budget, growing_history(rng, budget)


def test_a_compaction_whose_tail_crowds_the_new_block_reports_what_its_turn_sent(
    tmp_path: Path,
) -> None:
    """When the view a compaction leaves holds kept recall blocks that would leave the turn's
    new block too little room, they go as the compaction applies, and its audit row's
    chars_after is the chars_out the turn reports (history 1,581 above: a 5,325-char block
    kept in the tail at B = 10,000)."""
    budget, calls = generated(1581)
    settings = Settings(
        context_window_chars=budget,
        store=StoreSettings(path=str(tmp_path / "m.db")),
        long_term_enabled=False,
    )
    crowded = 0
    with MemoryEngine(settings) as engine:
        for history in calls:
            report = engine.prepare(history, session_id="h").report
            if report.compacted:
                rows = engine.store.compactions("h")
                applied = [r for r in rows if r["status"] == "applied"][-1]
                assert report.chars_out == applied["chars_after"]
                crowded += report.recall_evicted
    assert crowded  # the case arose: blocks left as a compaction applied


# ---------------------------------------------------------------------------- fuzzing

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True)
    | st.text(max_size=30)
    | st.sampled_from(["user", "assistant", "tool", "system", "text", "function"]),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                ["role", "content", "tool_calls", "tool_call_id", "name", "type", "text", "id"]
            )
            | st.text(max_size=8),
            children,
            max_size=5,
        )
    ),
    max_leaves=25,
)
messageish = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system"]) | json_values},
    optional={
        "content": json_values,
        "tool_calls": json_values,
        "tool_call_id": json_values,
        "name": json_values,
    },
)
histories = st.lists(messageish | json_values, max_size=8) | json_values


@pytest.fixture(scope="module")
def fuzz_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MemoryEngine]:
    path = tmp_path_factory.mktemp("fuzz") / "fuzz.db"
    with MemoryEngine(
        Settings(context_window_chars=8_000, store=StoreSettings(path=str(path)))
    ) as engine:
        yield engine


@given(
    messages=histories,
    session_id=st.text(min_size=1, max_size=5) | json_values,
    user_id=json_values,
)
def test_fuzzed_inputs_raise_nothing_but_invalid_messages(
    fuzz_engine: MemoryEngine, messages: Any, session_id: Any, user_id: Any
) -> None:
    """prepare, after_turn, recall and search over arbitrary JSON-like values."""
    for call in (fuzz_engine.prepare, fuzz_engine.after_turn):
        with contextlib.suppress(InvalidMessagesError):
            call(messages, session_id=session_id, user_id=user_id)
    with contextlib.suppress(InvalidMessagesError):
        assert isinstance(fuzz_engine.recall(session_id, messages, user_id, messages), str)
    search = getattr(fuzz_engine, "search", None)
    if search is not None:
        with contextlib.suppress(InvalidMessagesError):
            assert isinstance(search(session_id, messages, user_id=user_id), str)


# ---------------------------------------------------------------------------- processes


def child(db: str, name: str, turns: int, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKLOAD), db, name, str(turns), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def audit_consistent(db: str) -> tuple[str, int]:
    """(integrity_check result, applied generations without exactly one audit row)."""
    with sqlite3.connect(db, timeout=30) as conn:
        (integrity,) = conn.execute("PRAGMA integrity_check").fetchone()
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        if not {"sessions", "compactions"} <= tables:  # killed before its first migration
            return str(integrity), 0
        # A session's id is kept once, in ids (killed before that migration: in sessions).
        named = "ids.value AS id FROM sessions s JOIN ids ON ids.key = s.session_key"
        if "ids" not in tables:
            named = "s.session_id AS id FROM sessions s"
        broken = conn.execute(
            f"SELECT COUNT(*) FROM (SELECT s.generation, {named} WHERE s.generation > 0) AS s"
            " WHERE 1 != (SELECT COUNT(*) FROM compactions c WHERE c.session_id = s.id"
            " AND c.generation = s.generation AND c.status = 'applied')"
        ).fetchone()[0]
    return str(integrity), int(broken)


def test_sigkill_at_random_moments_leaves_a_consistent_store(tmp_path: Path) -> None:
    """30 SIGKILLs of a child mid-turn, mid-compaction and mid-extraction: the file passes
    integrity_check, every applied generation has exactly one audit row, the next child
    resumes on it, and a last child runs to the end."""
    db = str(tmp_path / "killed.db")
    rng = random.Random(30)
    kills = 0
    while kills < 30:
        process = child(db, "k", 40, "--slow")
        try:
            process.wait(timeout=rng.uniform(0.3, 1.6))
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
            kills += 1
        finally:
            assert process.stdout is not None
            process.stdout.close()
        assert ("ok", 0) == audit_consistent(db)
    finished = child(db, "k", 40, "--slow")
    out, _ = finished.communicate(timeout=300)
    assert 0 == finished.returncode
    assert [] == json.loads(out)["errors"]
    assert ("ok", 0) == audit_consistent(db)
    with sqlite3.connect(db) as conn:
        applied = conn.execute("SELECT COUNT(*) FROM compactions WHERE status = 'applied'")
        assert applied.fetchone()[0] > 0
        memories = conn.execute("SELECT COUNT(*) FROM memories").fetchone()[0]
    assert memories > 0
    print(f"\nreliability.sigkill kills={kills} integrity=ok unaudited_generations=0")


def test_two_processes_on_one_file_lose_nothing(tmp_path: Path) -> None:
    """Two processes driving sessions on one SQLite file: no `database is locked` (nor any
    other error) reaches the caller, and no compaction fails for locking."""
    db = str(tmp_path / "shared.db")
    processes = [child(db, name, 30) for name in ("p", "q")]
    outputs = [json.loads(p.communicate(timeout=300)[0]) for p in processes]
    assert [0, 0] == [p.returncode for p in processes]
    assert [[], []] == [o["errors"] for o in outputs]
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT status, COALESCE(error, '') FROM compactions").fetchall()
    assert [] == [error for status, error in rows if status == "failed"]
    assert sum(1 for status, _ in rows if status == "applied") >= 6
    print(f"\nreliability.two_processes calls={sum(o['calls'] for o in outputs)} failed=0")


# ---------------------------------------------------------------------------- threads

REF = re.compile(r"rm-[0-9a-f]{20}")
SESSION_TAG = re.compile(r"^— session (t\d+)", re.MULTILINE)
Prepared = tuple[str, str, dict[str, Any]]  # (view, recall block, report), refs normalised


def normalised(messages: list[Message]) -> str:
    """Recall refs are per store: compare the rest byte for byte."""
    return REF.sub("rm-REF", json.dumps(messages, ensure_ascii=False, sort_keys=True))


def user_of(number: int) -> str:
    return f"u{number % 7}"  # seven users, several sessions each


def own_user(number: int) -> str:
    return f"u{number}"  # every session its own user


def drive(
    engine: MemoryEngine,
    sessions: list[int],
    out: dict[tuple[int, int], Prepared],
    users: Callable[[int], str] = user_of,
) -> None:
    for number in sessions:
        rng = random.Random(number)
        for step, history in enumerate(growing_history(rng, 10_000)):
            prepared = engine.prepare(history, session_id=f"t{number}", user_id=users(number))
            view = [without_recall(m) for m in prepared.messages]
            carriers = [m for m, own in zip(prepared.messages, view, strict=True) if m != own]
            assert all(m["role"] == "user" for m in carriers)  # blocks ride on user messages
            block = "\n".join(m["content"][0]["text"] for m in carriers)
            report = attrs.asdict(prepared.report)
            for timing in ("duration_ms", "recalled", "recalled_chars"):
                report.pop(timing)
            out[(number, step)] = (normalised(view), REF.sub("rm-REF", block), report)


def test_eight_threads_give_the_sequential_results(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """8 threads × 50 sessions on one engine, recall on: every view and report equals the one
    a sequential run gives when each session is its own user (what a block shows of the
    session itself is read only after its own index batch is written, ``Indexer.wait_for``,
    so blocks match, and the blocks kept on earlier turns shape later views alike). With
    seven users sharing sessions, blocks may differ legitimately (a thread run has indexed a
    user's other sessions further or less far), but never show another user's."""
    settings = make_settings(context_window_chars=10_000, long_term_enabled=False)
    sequential: dict[tuple[int, int], Prepared] = {}
    with MemoryEngine(settings) as engine:
        drive(engine, list(range(50)), sequential, own_user)
    parallel: dict[tuple[int, int], Prepared] = {}
    shared: dict[tuple[int, int], Prepared] = {}
    for name, out, users in (("own", parallel, own_user), ("shared", shared, user_of)):
        other = Settings(
            context_window_chars=10_000,
            long_term_enabled=False,
            store=StoreSettings(path=str(tmp_path / f"threads-{name}.db")),
        )
        with MemoryEngine(other) as engine:
            threads = [
                threading.Thread(target=drive, args=(engine, list(range(k, 50, 8)), out, users))
                for k in range(8)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(300)
    assert sequential.keys() == parallel.keys() == shared.keys()
    assert {k: v[::2] for k, v in sequential.items()} == {k: v[::2] for k, v in parallel.items()}
    blocks = [(k[0], v[1]) for k, v in shared.items() if v[1]]
    assert len(blocks) > 50  # recall was at work
    for number, block in blocks:
        sources = {user_of(int(s[1:])) for s in SESSION_TAG.findall(block)}
        assert sources == {user_of(number)}, block[:300]


# ---------------------------------------------------------------------------- hostile stores


def run_turns(engine: MemoryEngine, session: str, turns: int, budget: int) -> list[Any]:
    rng = random.Random(session)
    reports = []
    history: list[Message] = [{"role": "system", "content": "agent"}]
    for turn in range(turns):
        history.append({"role": "user", "content": f"q{turn} " + text(rng, 200)})
        history.extend(loop(rng, budget, turn))
        history.append({"role": "user", "content": "and then?"})
        reports.append(engine.prepare(history, session_id=session, user_id="u1").report)
        engine.after_turn(history, session_id=session, user_id="u1")
        history.pop()
    return reports


def test_a_full_store_never_breaks_a_turn_nor_the_budget(
    make_settings: Callable[..., Settings],
) -> None:
    """Once the file cannot grow (max_page_count), every write fails inside the engine:
    turns go on, logged, and every output still fits B (the ceiling needs no store)."""
    with MemoryEngine(make_settings(context_window_chars=8_000)) as engine:
        run_turns(engine, "warm", 2, 8_000)
        (pages,) = engine.store.db.execute("PRAGMA page_count").fetchone()
        engine.store.db.execute(f"PRAGMA max_page_count = {pages}")
        reports = run_turns(engine, "full", 25, 8_000)
    assert all(r.chars_out <= 8_000 or r.over_budget for r in reports)
    assert sum(r.over_budget for r in reports) <= 2


def test_the_store_directory_deleted_mid_run_breaks_nothing(tmp_path: Path) -> None:
    """The store's directory removed while the engine runs: turns go on within B."""
    folder = tmp_path / "gone"
    settings = Settings(
        context_window_chars=8_000, store=StoreSettings(path=str(folder / "memory.db"))
    )
    with MemoryEngine(settings) as engine:
        run_turns(engine, "before", 3, 8_000)
        shutil.rmtree(folder)
        reports = run_turns(engine, "after", 20, 8_000)
    assert not folder.exists() or not os.listdir(folder)
    assert all(r.chars_out <= 8_000 or r.over_budget for r in reports)
