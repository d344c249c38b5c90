"""A scripted tool-calling model shared by the framework adapter tests: what it does depends
only on the chat dicts it is shown, so each framework's fake model wraps the same policy."""

from __future__ import annotations

import json
import re
from typing import Any

from ragent_memory import chars
from ragent_memory.longterm.vocabulary import HEADERS

REF = re.compile(r"recall: (rm-[0-9a-f]{20})")
TOPICS = ("refund policy", "shipping times", "warranty terms", "invoice format", "api limits")
FACT = "My name is Ada Lovelace and I live in Lisbon."
RECALL_EVERY = 10  # every 10th turn asks the model to read an earlier result back


def question(turn: int) -> str:
    topic = TOPICS[turn % len(TOPICS)]
    text = f"Turn {turn}: what do the docs say about {topic}?"
    if turn == 1:
        text = f"{FACT} {text}"
    if turn % RECALL_EVERY == 0 and turn:
        text += " Also re-read one earlier result in full."
    return text


def search_result(query: str, turn: int) -> str:
    """What the app's search_knowledge tool returns: 1.5–2.5k chars, unique per turn."""
    lines = 30 + (turn * 7) % 20
    return " ".join(
        f"Doc {turn}-{k}: the {query} section says item {k} applies." for k in range(lines)
    )


def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": function}]}  # fmt: skip


def is_memory_block(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, str) and any(content.startswith(h) for h in HEADERS.values())


def sent_chars(messages: list[dict[str, Any]]) -> int:
    """What the engine's budget covers: the model's input without the memory block."""
    return sum(chars(m) for m in messages if not is_memory_block(m))


def reply(messages: list[dict[str, Any]], n_call: int) -> dict[str, Any]:
    """The model's next message for this input (a tool call, or an answer after a result)."""
    last = messages[-1]
    if last["role"] != "user":
        return {"role": "assistant", "content": f"Answer {n_call}: item applies."}
    content = last["content"]  # recalled excerpts may come first, as a leading text part
    text = content if isinstance(content, str) else content[-1]["text"]
    turn = int(re.search(r"Turn (\d+)", text).group(1))  # type: ignore[union-attr]
    if "re-read one earlier result" in text:
        for message in messages:
            found = REF.search(str(message.get("content") or ""))
            if message["role"] == "tool" and found:
                # An extra argument and a number as a string: models do that.
                args = {"ref": found.group(1), "limit": "300", "reason": "verify"}
                return call(f"r{turn}-{message['tool_call_id']}", "recall_tool_result", args)
    topic = TOPICS[turn % len(TOPICS)]
    return call(f"c{turn}", "search_knowledge", {"query": topic, "turn": turn})


def original_of_recall(call_id: str) -> str:
    """The search result a recall call (``r{turn}-c{source}``) read back."""
    source = int(call_id.split("-c")[1])
    return search_result(TOPICS[source % len(TOPICS)], source)


def rereads(messages: list[dict[str, Any]]) -> int | None:
    """The turn, when ``messages`` is a re-read turn's first call holding a trimmed result
    (a tool message naming its recall ref)."""
    last = messages[-1]
    if last["role"] != "user":
        return None
    content = last["content"]
    text = content if isinstance(content, str) else content[-1]["text"]
    if "re-read one earlier result" not in text:
        return None
    held = any(m["role"] == "tool" and REF.search(str(m.get("content") or "")) for m in messages)
    return int(re.search(r"Turn (\d+)", text).group(1)) if held else None  # type: ignore[union-attr]


def check_agent_run(
    seen: list[list[dict[str, Any]]],
    raw: list[dict[str, Any]],
    audit: list[dict[str, Any]],
    budget: int,
) -> None:
    """What every adapter's 200-turn run must show: compactions that stick (none undone by
    the adapter handing over a differently shaped history), each model input within the
    budget (and the budget used), the raw history whole, recalls that read the originals
    back, and the other session's first call carrying the fact learned in the first."""
    assert [] == [row["generation"] for row in audit if row["status"] == "invalidated"]
    assert len([row for row in audit if row["status"] == "applied"]) >= 5
    assert 200 * 2 < len(seen)
    assert [] == [n for n, shown in enumerate(seen) if sent_chars(shown) > budget]
    assert max(sent_chars(shown) for shown in seen) > budget // 2
    users = [m["content"] for m in raw if m["role"] == "user"]
    assert [question(turn) for turn in range(200)] == users
    recalls = [m for m in raw if m["role"] == "tool" and m["tool_call_id"].startswith("r")]
    # Every re-read turn whose input held a trimmed result recalled one; a turn right after a
    # compaction holds none (its tail's results are whole), and the cycle may land on several.
    offered = {n for n in map(rereads, seen) if n is not None}
    assert offered == {int(m["tool_call_id"][1:].split("-")[0]) for m in recalls}
    assert len(recalls) >= 12
    for message in recalls:
        assert str(message["content"]).startswith(original_of_recall(message["tool_call_id"])[:300])
    first_call_of_other = seen[-2]  # system, memory block, the question
    assert "Ada Lovelace" in str(first_call_of_other[1]["content"])


LOCKER = "My locker code is 4417 at the Lisbon gym."
ASK_CODE = "What was my locker code again?"
SEARCH_ID = "search-1"


def search_reply(messages: list[dict[str, Any]], n_call: int) -> dict[str, Any]:
    """A model that calls search_memory (a limit as text, an undeclared key) when asked for
    the code, and acknowledges anything else."""
    last = messages[-1]
    content = last.get("content")
    text = content if isinstance(content, str) else str(content)
    if last["role"] == "user" and ASK_CODE in text:
        return call(SEARCH_ID, "search_memory", {"query": "locker code", "limit": "3", "x": 1})
    return {"role": "assistant", "content": f"Noted {n_call}."}


def searched(seen: list[list[dict[str, Any]]]) -> str:
    """The answer to the model's search_memory call, as a later model input showed it."""
    answers = [
        str(m["content"])
        for shown in seen
        for m in shown
        if m["role"] == "tool" and m.get("tool_call_id") == SEARCH_ID
    ]
    assert answers, "the search_memory call was never answered"
    return answers[-1]
