"""One agent host for the many-hosts tests: a process with its own engine on a shared store,
driven by JSON commands on stdin, answering one JSON line per command on stdout.

Commands: ``{"op": "run", "sessions": [...], "turns": [first, stop]}`` plays those turns of
each session and answers the SHA-256 of every prepared context (and the last one whole);
``{"op": "block"}`` makes the next compaction announce ``{"summarizing": session}`` and hang
(a host about to die mid-compaction); ``{"op": "quit"}`` closes the engine.

Run as ``python tests/host_worker.py URL PASSWORD_ENV LEASE_S``.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sessions import rag_turn

from ragent_memory import MemoryEngine, Settings, StoreSettings
from ragent_memory.summary.offline import OfflineSummarizer
from ragent_memory.summary.summarize import SummaryOutcome, SummaryRequest

CONTEXT_WINDOW_CHARS = 12_000


def host_settings(store: StoreSettings, **overrides: Any) -> Settings:
    """The settings every host and the single-process reference run with."""
    overrides.setdefault("compaction_timeout_s", 120)
    # Recall off, for two reasons that are not timing within one process (there,
    # ``Indexer.wait_for`` makes a session's block deterministic: see test_reliability's
    # eight-threads test, which runs with recall on). The reference is a single process on
    # SQLite (FTS5 BM25) while the hosts run on PostgreSQL (ts_rank): the two rank excerpts
    # differently by design. And a host writes a session's index batch off its caller's
    # thread; the host taking the session over waits only for its own process's batches.
    overrides.setdefault("recall_enabled", False)
    return Settings(context_window_chars=CONTEXT_WINDOW_CHARS, store=store, **overrides)


def history(session: str, turns: int) -> list[dict[str, Any]]:
    """Session ``session``'s first ``turns`` RAG turns: the same on every host."""
    rng = random.Random(session)
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"You help with {session}."}]
    for turn in range(turns):
        question, call, result, answer = rag_turn(turn, rng)
        # A long answer: the conversation outgrows the budget even with tool results trimmed.
        notes = " ".join(f"Note {turn}.{k}: step {rng.randint(1, 99)} is done." for k in range(30))
        messages += [question, call, result, {**answer, "content": f"{answer['content']} {notes}"}]
    return messages


def play(engine: MemoryEngine, session: str, turn: int) -> list[tuple[str, list[Any]]]:
    """Turn ``turn`` of a session as an agent runs it: prepare at the question, again after
    the tool result. Returns (digest, messages) of both prepared contexts."""
    full = history(session, turn + 1)
    out = []
    for end in (len(full) - 3, len(full) - 1):  # ends on the user message, then the tool result
        prepared = engine.prepare(full[:end], session_id=session)
        text = json.dumps(prepared.messages, ensure_ascii=False, sort_keys=True)
        out.append((hashlib.sha256(text.encode()).hexdigest(), prepared.messages))
    return out


class Blocking:
    """The offline summarizer, until ``block`` is set: then it announces and hangs."""

    name = "offline-extractive"

    def __init__(self) -> None:
        self.offline = OfflineSummarizer()
        self.block = False

    def summarize(self, request: SummaryRequest) -> SummaryOutcome:
        if self.block:
            print(json.dumps({"summarizing": True}), flush=True)
            threading.Event().wait()
        return self.offline.summarize(request)

    def close(self) -> None:
        return None


def main() -> None:
    url, password_env, lease_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    summarizer = Blocking()
    store = StoreSettings(url=url, password_env=password_env, lease_s=lease_s)
    engine = MemoryEngine(host_settings(store), summarizer=summarizer)
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "quit":
            break
        if command["op"] == "block":
            summarizer.block = True
            print(json.dumps({"ok": True}), flush=True)
            continue
        first, stop = command["turns"]
        digests: dict[str, list[str]] = {}
        last: dict[str, list[Any]] = {}
        for session in command["sessions"]:
            for turn in range(first, stop):
                for digest, messages in play(engine, session, turn):
                    digests.setdefault(session, []).append(digest)
                    last[session] = messages
        print(json.dumps({"digests": digests, "last": last}), flush=True)
    engine.close()


if __name__ == "__main__":
    main()
