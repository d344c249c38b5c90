"""Recall and the prompt cache (docs/design.md §4, §9b): on a RAG agent's session with recall
on, only a trim or a compaction changes the bytes an earlier call sent, and recall's excerpts
still reach the model."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from sessions import tool_loop

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


def has_block(messages: Sequence[dict[str, Any]]) -> bool:
    content = messages[-1]["content"]
    return isinstance(content, list) and content[0]["text"].startswith(HEADERS["en"])


def test_only_trims_and_compactions_move_what_an_earlier_call_sent(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """A call with no trim, no compaction and nothing the ceiling must lower (earlier recall
    blocks included) starts with the previous call's messages byte for byte, at every model call of a RAG agent's turns, while
    recall keeps bringing excerpts back on the turns' questions."""
    engine = make_engine(make_settings(context_window_chars=20_000))
    rng = random.Random(3)
    history: list[dict[str, Any]] = [{"role": "system", "content": "You answer from the docs."}]
    previous: list[dict[str, Any]] | None = None
    last_trimmed = last_generation = -1
    quiet: list[float] = []
    evicted_quietly = blocks = 0
    for turn in range(150):
        messages = rag_turn(turn, rng)
        for upto in (1, 3):  # the model is called on the question and after the tool loop
            added = messages[:upto] if upto == 1 else messages[1:upto]
            prepared = engine.prepare([*history, *messages[:upto]], session_id="rag")
            report = prepared.report
            # the previous call plus what was appended past B: the ceiling must change something
            over = previous is not None and sum(map(chars, [*previous, *added])) > 20_000
            blocks += upto == 1 and report.recalled > 0 and has_block(prepared.messages)
            event = (
                over
                or report.compacted
                or (report.trimmed, report.generation)
                != (
                    last_trimmed,
                    last_generation,
                )
            )
            if previous is not None and not event:
                quiet.append(share(previous, prepared.messages))
                evicted_quietly += report.recall_evicted
            previous, last_trimmed, last_generation = (
                prepared.messages,
                report.trimmed,
                report.generation,
            )
        history += messages
        engine.after_turn(history, session_id="rag")
    assert sum(quiet) / len(quiet) >= 0.95
    assert min(quiet) == 1.0, sorted(quiet)[:5]
    assert len(quiet) > 100 and blocks > 60
    assert evicted_quietly == 0
