"""Recall and the prompt cache (docs/design.md §4, §9b): on a RAG agent's session with recall
on, only a trim or a compaction changes the bytes an earlier call sent, and recall's excerpts
still reach the model."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from sessions import LateSummarizer, tool_loop

from ragent_memory import Settings
from ragent_memory.core.chars import chars
from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.recall.excerpts import HEADERS

TOPICS = ("refund policy", "shipping times", "warranty terms", "api limits", "sso setup")
FACTS = {
    "refund policy": "Refunds go back to the card within 14 days.",
    "shipping times": "Standard parcels take 3 to 5 business days.",
    "warranty terms": "Hardware carries a 24-month warranty.",
    "api limits": "The public API allows 600 requests per minute.",
    "sso setup": "Single sign-on supports SAML and OIDC.",
}


def rag_turn(turn: int, rng: random.Random) -> list[dict[str, Any]]:
    """One turn of a RAG agent: a question, one search, a long result, an answer."""
    topic = TOPICS[turn % len(TOPICS)]
    rows = "\n".join(
        f"[{topic} · doc {k}] {FACTS[topic]} (ticket T-{rng.randint(1_000, 9_999)})"
        for k in range(rng.randint(8, 20))
    )
    return [
        {"role": "user", "content": f"What does the {topic} say for ticket {turn}?"},
        *tool_loop(f"call_{turn}", rows, arguments=f'{{"query": "{topic}"}}'),
        {"role": "assistant", "content": f"Per the docs: {FACTS[topic]} (turn {turn})"},
    ]


def share(previous: Sequence[dict[str, Any]], sent: Sequence[dict[str, Any]]) -> float:
    """The share of the previous call's chars this call repeats as its prefix (whole messages,
    as a provider's prompt cache reuses them)."""
    same = 0
    while same < min(len(previous), len(sent)) and previous[same] == sent[same]:
        same += 1
    return sum(map(chars, previous[:same])) / sum(map(chars, previous))


def joined(message: dict[str, Any]) -> int:
    """A message's chars as the engine counts them against B: a block carried as its own text
    part adds the newline a consumer joining the parts puts before the question."""
    content = message.get("content")
    return chars(message) + (len(content) - 1 if isinstance(content, list) else 0)


def has_block(messages: Sequence[dict[str, Any]]) -> bool:
    content = messages[-1]["content"]
    return isinstance(content, list) and content[0]["text"].startswith(HEADERS["en"])


class Calls:
    """A RAG agent's calls through ``engine``: each call that changed nothing it had to (no
    trim, no compaction, nothing the ceiling must lower) measured against the previous one."""

    def __init__(self) -> None:
        self.quiet: list[float] = []  # their shares of the previous call's chars
        self.evicted_quietly = 0  # kept recall blocks they took off
        self.blocks = 0  # questions that brought a recall block
        self.pending = 0  # calls where a due compaction was still being written

    def run(self, engine: MemoryEngine, turns: int) -> None:
        rng = random.Random(3)
        history: list[dict[str, Any]] = [{"role": "system", "content": "You answer from the docs."}]
        previous: list[dict[str, Any]] | None = None
        last_trimmed = last_generation = -1
        for turn in range(turns):
            messages = rag_turn(turn, rng)
            for upto in (1, 3):  # the model is called on the question and after the tool loop
                added = messages[:upto] if upto == 1 else messages[1:upto]
                prepared = engine.prepare([*history, *messages[:upto]], session_id="rag")
                report = prepared.report
                # the previous call plus what was appended past B: the ceiling must change something
                over = previous is not None and sum(map(joined, [*previous, *added])) > 20_000
                self.blocks += upto == 1 and report.recalled > 0 and has_block(prepared.messages)
                self.pending += report.skipped_reason == "in_progress"
                event = over or report.compacted
                event = event or (report.trimmed, report.generation) != (
                    last_trimmed,
                    last_generation,
                )
                if previous is not None and not event:
                    self.quiet.append(share(previous, prepared.messages))
                    self.evicted_quietly += report.recall_evicted
                previous, last_trimmed = prepared.messages, report.trimmed
                last_generation = report.generation
            history += messages
            engine.after_turn(history, session_id="rag")


def test_only_trims_and_compactions_move_what_an_earlier_call_sent(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """A call with no trim, no compaction and nothing the ceiling must lower (earlier recall
    blocks included) starts with the previous call's messages byte for byte, at every model
    call of a RAG agent's turns, while recall keeps bringing excerpts back on the turns'
    questions."""
    calls = Calls()
    calls.run(engine=make_engine(make_settings(context_window_chars=20_000)), turns=150)
    assert sum(calls.quiet) / len(calls.quiet) >= 0.95
    assert min(calls.quiet) == 1.0, sorted(calls.quiet)[:5]
    assert len(calls.quiet) > 100 and calls.blocks > 60
    assert calls.evicted_quietly == 0


def test_while_a_summary_is_being_written_kept_blocks_wait_for_an_event(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """A slow model (``compaction_timeout_s: 0``, the summary lands only at the end): while
    the due compaction is pending, earlier turns' kept blocks that crowd a new question's
    block leave only with a trim or a rung of the ceiling, never in a call that changes
    nothing else; the questions still get blocks in the room left."""
    model = LateSummarizer()
    settings = make_settings(context_window_chars=20_000, compaction_timeout_s=0)
    engine = make_engine(settings, summarizer=model)
    calls = Calls()
    try:
        calls.run(engine, turns=150)
    finally:
        model.landed.set()
    assert calls.pending > 100  # the scenario: most calls ran with the summary pending
    assert min(calls.quiet) == 1.0, sorted(calls.quiet)[:5]
    assert calls.evicted_quietly == 0
    assert len(calls.quiet) > 50 and calls.blocks > 30
