"""Retention on BEAM: long technical chats, where every assistant reply is thousands of chars.

BEAM ("Beyond a Million Tokens", Tavakoli et al. 2025) chats are a user building something with
an assistant over ten sessions (batches), with details said once, values that change later and
dates on the user's turns. Same protocol as ``benchmarks.locomo``: the chat is driven turn by
turn with the offline summarizer (``prepare`` on each user message, ``after_turn`` after each
turn), then each question is asked as the final user message and counts when every content
word of its gold answer is in what ``prepare`` returned.

Scoring, the same for every arm, with what BEAM's phrasing needs on top of LoCoMo's:
- the question's own words are taken out of the gold answer first (answers restate it);
- words that talk about the conversation rather than its content ("mentioned", "said",
  "order", "first"…) are dropped from the gold;
- light stemming on both sides (``completed`` / ``completing`` / ``completes`` meet).

Kinds of question (two per chat each): ``information_extraction`` (a detail said once),
``knowledge_update`` (the latest value of something that changed), ``multi_session_reasoning``
(two or more sessions put together), ``temporal_reasoning`` (when), ``event_ordering``.

Arms, at each B: ``full`` (the whole chat), ``truncation`` (the newest messages that fit B),
``engine`` (one session for the whole chat, recall on), ``sessions`` (each batch a session of
the same user, the question asked in a fresh session of that user). Each user message carries
its date (``time_anchor``) in front when it differs from the previous one, the way a chat app
stamps a new day.

Data: ../shared/bench-data/beam/500K (ten chats). ``python -m benchmarks.beam [--chat 1]
[--budget 20000] [--arm engine]``; results go to ``benchmarks/results/beam.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.locomo import STOP, context_text, drive, engine_settings, finish, newest, quiet_logs
from ragent_memory import MemoryEngine
from ragent_memory.settings import RECALL_TURN_CHARS

ROOT = Path(__file__).resolve().parent.parent
DATA = next(
    (
        p
        for p in (
            Path(os.environ.get("BEAM_DIR", "/nonexistent")),
            ROOT.parent / "shared" / "bench-data" / "beam" / "500K",
            ROOT.parent.parent / "shared" / "bench-data" / "beam" / "500K",
        )
        if p.is_dir()
    ),
    ROOT.parent / "shared" / "bench-data" / "beam" / "500K",
)
RESULTS = Path(__file__).resolve().parent / "results" / "beam.json"
BUDGETS = (20_000, 40_000)
ARMS = ("full", "truncation", "engine", "sessions")
KINDS = (
    "information_extraction",
    "knowledge_update",
    "multi_session_reasoning",
    "temporal_reasoning",
    "event_ordering",
)
# Words about the conversation, not its content: a gold answer's "you mentioned …, then …"
META = frozenset(
    [
        "mention",
        "mentioned",
        "mentions",
        "said",
        "say",
        "says",
        "told",
        "tell",
        "asked",
        "ask",
        "asking",
        "discussed",
        "discuss",
        "discussion",
        "discussions",
        "conversation",
        "conversations",
        "order",
        "first",
        "second",
        "third",
        "then",
        "next",
        "later",
        "after",
        "before",
        "finally",
        "initially",
        "earlier",
        "progressed",
        "progress",
        "progression",
        "went",
        "also",
        "about",
        "regarding",
        "following",
        "follows",
        "items",
        "item",
        "step",
        "steps",
        "stage",
        "stages",
        "specifically",
        "noted",
        "note",
        "brought",
        "up",
        "started",
        "began",
        "starting",
        "point",
        "points",
        "shared",
        "share",
        "mention",
        "were",
        "had",
        "has",
        "have",
        "would",
        "will",
        "can",
        "could",
        "should",
        "may",
        "might",
        "there",
        "here",
        "these",
        "those",
        "yes",
        "total",
        "all",
        "any",
        "some",
        "each",
        "both",
        "into",
        "over",
        "out",
        "up",
        "i'm",
        "you've",
        "you'd",
        "you're",
    ]
)
WORD = re.compile(r"[a-z0-9]+(?:\.[0-9]+)*")
Message = dict[str, Any]


def light_stem(word: str) -> str:
    """completed / completing / completes → complet; numbers and short words stay."""
    if word[0].isdigit() or len(word) <= 4:
        return word
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 4:
            return word[: -len(suffix)]
    return word


def words(text: str) -> set[str]:
    return {light_stem(w) for w in WORD.findall(text.lower()) if w not in STOP}


def gold_words(answer: str, question: str) -> set[str]:
    """The answer's content words that the question does not already say."""
    meta = {light_stem(w) for w in META}
    return words(answer) - words(question) - meta


def stamp(anchor: str) -> str:
    """``January-05-2024`` → ``January 5, 2024`` (as the answers write dates)."""
    try:
        return datetime.strptime(anchor, "%B-%d-%Y").strftime("%B %-d, %Y")
    except ValueError:
        return anchor


def chat_sessions(chat: list[dict[str, Any]]) -> list[list[Message]]:
    """Each batch of a chat as its own list of chat messages, dated where the date changes."""
    sessions, last = [], ""
    for batch in chat:
        out = []
        for group in batch["turns"]:
            for message in group:
                text = message["content"]
                anchor = message.get("time_anchor") or ""
                if message["role"] == "user" and anchor and anchor != last:
                    text, last = f"[{stamp(anchor)}] {text}", anchor
                out.append({"role": message["role"], "content": text})
        sessions.append(out)
    return sessions


def chat_questions(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text())
    return [
        {"kind": kind, "question": q["question"], "answer": q["answer"]}
        for kind in KINDS
        for q in data.get(kind, [])
        if q.get("answer")
    ]


class Tally:
    def __init__(self) -> None:
        self.kept: dict[str, dict[str, list[float]]] = {a: {k: [] for k in KINDS} for a in ARMS}
        self.sent: dict[str, list[int]] = {arm: [] for arm in ARMS}
        self.block: dict[str, list[int]] = {arm: [] for arm in ARMS}  # the recall block's chars

    def add(
        self, arm: str, q: dict[str, Any], messages: Sequence[Message], block: int | None = None
    ) -> None:
        gold = gold_words(q["answer"], q["question"])
        if not gold:
            return
        context = context_text(messages, q["question"])
        self.kept[arm][q["kind"]].append(float(gold <= words(context)))
        self.sent[arm].append(len(context))
        if block is not None:
            self.block[arm].append(block)

    def merge(self, other: Tally) -> None:
        for arm in ARMS:
            for kind in KINDS:
                self.kept[arm][kind] += other.kept[arm][kind]
            self.sent[arm] += other.sent[arm]
            self.block[arm] += other.block[arm]

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for arm in ARMS:
            every = [v for kind in KINDS for v in self.kept[arm][kind]]
            out[arm] = {
                "answers": round(sum(every) / len(every), 4) if every else None,
                "questions": len(every),
                "mean_chars": round(sum(self.sent[arm]) / len(self.sent[arm]))
                if self.sent[arm]
                else None,
                "by_kind": {
                    k: round(sum(v) / len(v), 4) if v else None for k, v in self.kept[arm].items()
                },
            }
            if self.block[arm]:  # the room the question's recall block had (engine arms)
                out[arm]["mean_block_chars"] = round(statistics.fmean(self.block[arm]))
        return out


def run_chat(
    sessions: list[list[Message]],
    qa: list[dict[str, Any]],
    budget: int,
    tmp: Path,
    name: str,
    arms: Sequence[str],
    turn_chars: int | None = RECALL_TURN_CHARS,
) -> Tally:
    tally = Tally()
    messages = [m for s in sessions for m in s]
    for q in qa:
        if "full" in arms:
            tally.add("full", q, messages)
        if "truncation" in arms:
            tally.add("truncation", q, newest(messages, budget))
    if "engine" in arms:
        path = tmp / f"{name}-{budget}-engine.db"
        with MemoryEngine(
            engine_settings(budget, path, recall=True, turn_chars=turn_chars)
        ) as engine:
            drive(engine, messages, session_id=name, user_id=name)
            for q in qa:
                asked = [*messages, {"role": "user", "content": q["question"]}]
                prepared = engine.prepare(asked, session_id=name, user_id=name)
                tally.add("engine", q, prepared.messages, prepared.report.recalled_chars)
    if "sessions" in arms:
        path = tmp / f"{name}-{budget}-sessions.db"
        with MemoryEngine(
            engine_settings(budget, path, recall=True, turn_chars=turn_chars)
        ) as engine:
            for k, session in enumerate(sessions):
                drive(engine, session, session_id=f"{name}-b{k + 1}", user_id=name)
            for k, q in enumerate(qa):
                asked = [{"role": "user", "content": q["question"]}]
                prepared = engine.prepare(asked, session_id=f"{name}-q{k}", user_id=name)
                tally.add("sessions", q, prepared.messages, prepared.report.recalled_chars)
    return tally


def table(results: dict[str, Any]) -> str:
    lines = []
    for budget, row in results["mean"].items():
        lines += [
            f"\nB = {int(budget):,}\n",
            "| kind | " + " | ".join(ARMS) + " |",
            "| --- | " + " | ".join("---" for _ in ARMS) + " |",
        ]
        for kind in KINDS:
            cells = [row[a]["by_kind"][kind] for a in ARMS]
            lines.append(
                f"| {kind} | " + " | ".join("–" if c is None else f"{c:.3f}" for c in cells) + " |"
            )
        cells = [row[a]["answers"] for a in ARMS]
        lines.append(
            "| **all** | " + " | ".join("–" if c is None else f"**{c:.3f}**" for c in cells) + " |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chat", action="append", help="only these chats (1…10)")
    parser.add_argument("--budget", type=int, action="append", help="only these budgets")
    parser.add_argument("--arm", action="append", choices=ARMS, help="only these arms")
    parser.add_argument("--no-write", action="store_true", help="do not write the JSON")
    args = parser.parse_args(argv)
    quiet_logs()
    chats = sorted((p for p in DATA.glob("*") if p.is_dir()), key=lambda p: int(p.name))
    if args.chat:
        chats = [c for c in chats if c.name in args.chat]
    if not chats:
        print(f"BEAM data not found under {DATA}; skipping the BEAM benchmark")
        return
    budgets, arms = tuple(args.budget or BUDGETS), tuple(args.arm or ARMS)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks.beam", *(argv or sys.argv[1:])]),
        "scoring": "answers: share of questions whose gold answer's content words (less the "
        "question's own words and words about the conversation, lightly stemmed) are all in the "
        "context; pooled over every scored question of the chats run",
        "chats": [c.name for c in chats],
        "arms": list(arms),
        "per_chat": {},
        "mean": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for budget in budgets:
            overall = Tally()
            for chat in chats:
                sessions = chat_sessions(json.loads((chat / "chat.json").read_text()))
                qa = chat_questions(chat / "probing_questions.json")
                tally = run_chat(sessions, qa, budget, Path(tmp), f"beam-{chat.name}", arms)
                overall.merge(tally)
                row = tally.row()
                results["per_chat"].setdefault(str(budget), {})[chat.name] = row
                print(
                    f"B={budget:>6,} chat {chat.name:>2}: "
                    + "  ".join(f"{a} {row[a]['answers'] or 0:.2f}" for a in arms),
                    flush=True,
                )
            results["mean"][str(budget)] = overall.row()
    results["seconds"] = round(time.perf_counter() - started, 1)
    print("\nBEAM, answers kept (every content word of the gold answer in the context):")
    finish(results, table(results), arms, None if args.no_write else RESULTS)


if __name__ == "__main__":
    main()
