"""A child process for the reliability suite: drives sessions on one SQLite file.

``python tests/workload.py DB NAME TURNS [--slow]`` runs sessions ``NAME-0..2`` (users shared
between processes, so long-term memory is written from both) for TURNS turns each, resuming
each history from the turns the store's audit already knows nothing about: the history is
deterministic, so a restarted child replays it and the engine continues where it was.

With ``--slow`` the summarizer and the extractor sleep a little, so a kill lands
mid-compaction and mid-extraction often. It prints one JSON line: what reached the caller.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sessions import rag_turn

from ragent_memory import Settings, StoreSettings
from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.longterm.model import build_extractor
from ragent_memory.summary.offline import OfflineSummarizer
from ragent_memory.summary.summarize import SummaryOutcome, SummaryRequest


class Sleepy:
    """The offline summarizer, a little slow."""

    name = "sleepy"

    def __init__(self, delay_s: float) -> None:
        self.offline = OfflineSummarizer()
        self.delay_s = delay_s

    def summarize(self, request: SummaryRequest) -> SummaryOutcome:
        time.sleep(self.delay_s)
        return self.offline.summarize(request)

    def close(self) -> None:
        return None


class SleepyExtractor:
    """The offline extractor, a little slow."""

    def __init__(self, inner: Any, delay_s: float) -> None:
        self.inner = inner
        self.delay_s = delay_s

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if not callable(attribute) or name == "close":
            return attribute

        def slow(*args: Any, **kwargs: Any) -> Any:
            time.sleep(self.delay_s)
            return attribute(*args, **kwargs)

        return slow


def history(session: str, turns: int) -> list[dict[str, Any]]:
    rng = random.Random(session)
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a support agent."}]
    for turn in range(turns):
        out += rag_turn(turn, rng)
        out[-4] = {
            **out[-4],
            "content": f"{out[-4]['content']} I prefer answers under {turn} lines.",
        }
    return out


def main() -> None:
    db, name, turns = sys.argv[1], sys.argv[2], int(sys.argv[3])
    slow = "--slow" in sys.argv
    settings = Settings(context_window_chars=12_000, store=StoreSettings(path=db))
    kwargs: dict[str, Any] = {}
    if slow:
        kwargs["summarizer"] = Sleepy(0.05)
        kwargs["extractor"] = SleepyExtractor(build_extractor(settings), 0.05)
    errors: list[str] = []
    calls = 0
    with MemoryEngine(settings, **kwargs) as engine:
        sessions = [f"{name}-{k}" for k in range(3)]
        full = {s: history(s, turns) for s in sessions}
        for turn in range(1, turns + 1):
            for k, session in enumerate(sessions):
                messages = full[session][: 1 + 4 * turn]
                user = f"user-{k}"
                try:
                    engine.prepare(messages[:-3], session_id=session, user_id=user)
                    engine.prepare(messages[:-1], session_id=session, user_id=user)
                    engine.after_turn(messages, session_id=session, user_id=user)
                except Exception as err:  # counted: nothing may reach the caller
                    errors.append(f"{type(err).__name__}: {err}")
                calls += 1
        engine.flush(timeout_s=60)
    print(json.dumps({"calls": calls, "errors": errors}))


if __name__ == "__main__":
    main()
