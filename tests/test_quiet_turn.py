"""The quiet turn: when a turn only appended messages and no gate can fire, ``Session.run``
grows last turn's view and skips the gates (``Session._quiet``). Twin engines, one with that
path and one without it, must prepare the same messages and the same report on every call,
whatever the caller does between calls."""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from sessions import SYSTEM, LateSummarizer, rag_turn

from ragent_memory import MemoryEngine, Settings, StoreSettings
from ragent_memory.engine.session import Session, View

Message = dict[str, Any]
REF = re.compile(r"rm-[0-9a-f]{20}")  # recall refs: each store signs its own


class Twins:
    """Two engines on the same calls, each over its own copy of the history; the second never
    takes the quiet path. ``call`` asserts they prepare the same."""

    def __init__(self, tmp_path: Path, summarizer: Any = None, **settings: Any) -> None:
        self.engines = [
            MemoryEngine(
                Settings(
                    recall_enabled=False,
                    store=StoreSettings(path=str(tmp_path / f"{name}.db")),
                    **{"context_window_chars": 20_000, **settings},
                ),
                summarizer=summarizer,
            )
            for name in ("quiet", "gated")
        ]
        self.histories: list[list[Message]] = [[copy.deepcopy(SYSTEM)] for _ in self.engines]
        self.outputs: list[list[Message]] = [[], []]
        self.quiet = self.gated = 0  # quiet-path decisions of the first engine
        self.compacted = self.trimmed = 0
        self.settle = False  # wait for background compactions before each call

    def quiet_path(self, original: Callable[[Session, View], bool]) -> Any:
        gated_store = self.engines[1].store

        def decide(session: Session, view: View) -> bool:
            if session.services.store is gated_store:
                return False
            taken = original(session, view)
            self.quiet += taken
            self.gated += not taken
            return taken

        return decide

    def each(self, change: Callable[[list[Message]], Any]) -> None:
        """The same change to both histories (each its own dicts)."""
        for history in self.histories:
            change(history)

    def add(self, *messages: Message) -> None:
        self.each(lambda history: history.extend(copy.deepcopy(list(messages))))

    def call(self, **kwargs: Any) -> None:
        if self.settle:  # each engine then adopts a finished summary on the same call
            for engine in self.engines:
                assert engine.flush(30)
        before = [copy.deepcopy(h) for h in self.histories]
        a, b = (
            e.prepare(h, session_id="s", **kwargs)
            for e, h in zip(self.engines, self.histories, strict=True)
        )
        assert REF.sub("rm-", repr(a.messages)) == REF.sub("rm-", repr(b.messages))
        fields = [
            {k: v for k, v in attrs.asdict(p.report).items() if k != "duration_ms"} for p in (a, b)
        ]
        assert fields[0] == fields[1]
        assert self.histories == before  # the caller's messages are never mutated
        self.outputs = [a.messages, b.messages]
        self.compacted += a.report.compacted
        self.trimmed = max(self.trimmed, a.report.trimmed)

    def close(self) -> None:
        for engine in self.engines:
            engine.close()


@pytest.fixture
def twins_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Twins]]:
    made: list[Twins] = []

    def make(summarizer: Any = None, **settings: Any) -> Twins:
        twins = Twins(tmp_path / str(len(made)), summarizer, **settings)
        monkeypatch.setattr(Session, "_quiet", twins.quiet_path(Session._quiet))
        made.append(twins)
        return twins

    yield make
    for twins in made:
        twins.close()


def tool_heavy_turn(turn: int, rng: random.Random, calls: int = 5) -> list[Message]:
    """A question, ``calls`` tool loops of one call each, an answer."""
    out: list[Message] = [{"role": "user", "content": f"Turn {turn}: check the logs"}]
    for k in range(calls):
        call_id = f"t{turn}_{k}"
        name = "search_knowledge" if k % 2 else "read_file"
        out += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": f'{{"k": {k}}}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": "log " * rng.randint(20, 400)},
        ]
    return [*out, {"role": "assistant", "content": "Checked."}]


def zh_turn(turn: int, rng: random.Random) -> list[Message]:
    messages = rag_turn(turn, rng)
    messages[0] = {"role": "user", "content": f"第{turn}轮：文档里关于退款政策怎么说？"}
    messages[2] = {**messages[2], "content": "文档说明退款政策适用。" * rng.randint(30, 120)}
    return messages


def chat_turn(turn: int, rng: random.Random) -> list[Message]:
    """No tools at all: nothing gate 1 may evict, so only compaction and the ceiling act."""
    return [
        {"role": "user", "content": f"Turn {turn}: tell me more. " + "q" * rng.randint(10, 900)},
        {"role": "assistant", "content": "Here is more. " + "a" * rng.randint(100, 1_800)},
    ]


def edit(turn: int, history: list[Message]) -> None:
    """What callers do between turns, one kind per turn number."""
    if turn % 11 == 3:  # an old dict's content replaced in place
        history[len(history) // 2]["content"] = f"edited at turn {turn}"
    elif turn % 11 == 5:  # inside an old tool call, in place
        for message in history[len(history) // 3 :]:
            if message.get("tool_calls"):
                message["tool_calls"][0]["function"]["arguments"] = f'{{"edited": {turn}}}'
                break
    elif turn % 11 == 7:  # the whole history rebuilt as equal dicts
        history[:] = copy.deepcopy(history)
    elif turn % 11 == 9:  # truncated: the last turn taken back
        del history[-4:]


def drive(twins: Twins, turns: int, turn_of: Callable[[int, random.Random], list[Message]]):
    rng = random.Random(7)
    for turn in range(turns):
        messages = turn_of(turn, rng)
        if turn % 13 == 6 and len(messages) > 2:  # an oversized result: a preview is due
            messages[2] = {**messages[2], "content": "big " * 3_000}
        twins.add(messages[0])
        twins.call()
        for message in messages[1:-1]:  # mid-turn calls: tool loops open
            twins.add(message)
            if message["role"] == "tool" and rng.random() < 0.3:
                twins.call()
        twins.add(messages[-1])
        if turn % 4 == 1:  # the caller decorates what it got: later turns must not see it
            for out in twins.outputs:
                out[-1]["content"] = "decorated"
                out[0]["extra"] = {"cache_control": True}
        if turn > 10:
            twins.each(lambda history, turn=turn: edit(turn, history))


@pytest.mark.parametrize(
    ("turn_of", "settings"),
    [
        (rag_turn, {}),
        (zh_turn, {"language": "zh"}),
        (tool_heavy_turn, {}),
        (rag_turn, {"summary_enabled": False}),
        (rag_turn, {"context_window_chars": 200_000}),
        (chat_turn, {}),
        (chat_turn, {"summary_enabled": False}),
    ],
    ids=["en", "zh", "tools", "no-summary", "large-budget", "chat", "chat-no-summary"],
)
def test_quiet_path_prepares_what_the_gates_do(
    twins_of: Callable[..., Twins],
    turn_of: Callable[[int, random.Random], list[Message]],
    settings: dict[str, Any],
) -> None:
    twins = twins_of(**settings)
    drive(twins, 60, turn_of)
    twins.call(verify=True)
    assert twins.quiet >= 15 and twins.gated >= 1  # both paths were exercised


def test_a_late_summary_is_adopted_on_the_quiet_path_too(twins_of: Callable[..., Twins]) -> None:
    """A summary that lands between turns is adopted by the next call on both engines alike
    (no quiet turn while one is pending or due)."""
    late = LateSummarizer()
    twins = twins_of(late, compaction_timeout_s=0)
    rng = random.Random(3)
    try:
        for turn in range(40):
            messages = rag_turn(turn, rng)
            twins.add(messages[0])
            twins.call()
            twins.add(*messages[1:3])
            twins.call()  # mid-turn: nothing is due, yet a compaction may be running
            twins.add(messages[3], {"role": "assistant", "content": "note " + "y" * 900})
            if turn == 14:  # taken back while a compaction runs: under the trigger
                twins.each(lambda history: history.__delitem__(slice(-60, None)))
            if turn == 25:
                late.landed.set()
                twins.settle = True
    finally:
        late.landed.set()
    assert twins.compacted and twins.quiet and twins.gated
