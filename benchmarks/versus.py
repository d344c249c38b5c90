"""Per-turn overhead side by side: ``MemoryEngine.prepare`` vs LangChain's
``SummarizationMiddleware.before_model`` on the same session, in the same process.

Both get the same 400-turn simulated RAG session and an equivalent budget: B = 400,000 chars
for ragent_memory; for LangChain, a trigger at 80% and a kept tail of 20% of B / 4 tokens (its
default counter estimates ~4 chars per token). LangChain's summarizer is a constant string
returned instantly, so what is timed is the middleware itself; ragent_memory runs its real
offline summarizer, trim, reduction and SQLite audit. LangChain holds its messages as
``BaseMessage`` objects and, after summarizing, replaces its state (as its agent loop does);
ragent_memory receives the app's growing list of dicts, which it never edits.

Needs the ``bench`` extra (``make bench`` installs it); without LangChain it says so and stops.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog

from ragent_memory import MemoryEngine, Settings, StoreSettings
from ragent_memory.demo import simulate_session

BUDGET = 400_000
TURNS = 400


def time_ragent(turns: list[list[dict[str, Any]]], db: Path) -> list[float]:
    settings = Settings(context_window_chars=BUDGET, store=StoreSettings(path=str(db)))
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a support agent."}]
    timings = []
    with MemoryEngine(settings) as engine:
        for messages in turns:
            history.append(messages[0])
            started = time.perf_counter()
            engine.prepare(history, session_id="bench")
            timings.append((time.perf_counter() - started) * 1000)
            history.extend(messages[1:])
    return timings


def time_langchain(turns: list[list[dict[str, Any]]]) -> list[float] | None:
    try:
        from langchain.agents.middleware import SummarizationMiddleware
        from langchain_core.language_models.fake_chat_models import FakeListChatModel
        from langchain_core.messages import convert_to_messages
    except ImportError:
        return None
    summary = "Summary: the user asked support questions."
    middleware = SummarizationMiddleware(
        model=FakeListChatModel(responses=[summary]),
        summarizer=lambda _messages: summary,
        trigger=("tokens", int(0.8 * BUDGET / 4)),
        keep=("tokens", int(0.2 * BUDGET / 4)),
    )
    # Conversion is the app's own cost in LangChain (it holds BaseMessages), so it is untimed.
    converted = [convert_to_messages(messages) for messages in turns]
    state: list[Any] = convert_to_messages(
        [{"role": "system", "content": "You are a support agent."}]
    )
    timings = []
    for messages in converted:
        state.append(messages[0])
        started = time.perf_counter()
        update = middleware.before_model({"messages": state}, None)  # type: ignore[arg-type]
        timings.append((time.perf_counter() - started) * 1000)
        if update is not None:  # RemoveMessage(all) + summary + preserved, as the agent applies
            state = list(update["messages"][1:])
        state.extend(messages[1:])
    return timings


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    turns = simulate_session(TURNS)
    with tempfile.TemporaryDirectory() as tmp:
        ours = time_ragent(turns, Path(tmp) / "bench.db")
    theirs = time_langchain(turns)
    if theirs is None:
        print("LangChain is not installed (pip install -e '.[bench]'); skipping the comparison")
        return
    print(f"per-turn overhead, {TURNS} simulated RAG turns, B = {BUDGET:,} chars\n")
    print(f"{'':<32} {'median ms':>10} {'p95 ms':>8} {'last-100 median':>16}")
    rows = {"ragent_memory prepare": ours, "LangChain SummarizationMiddleware": theirs}
    for name, timings in rows.items():
        p95 = statistics.quantiles(timings, n=20)[18]
        print(
            f"{name:<32} {statistics.median(timings):>10.3f} {p95:>8.3f} "
            f"{statistics.median(timings[-100:]):>16.3f}"
        )
    ratio = statistics.median(theirs[-100:]) / statistics.median(ours[-100:])
    print(f"\nlast-100 median: LangChain / ragent_memory = {ratio:.1f}x")


if __name__ == "__main__":
    main()
