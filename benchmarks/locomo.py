"""Retention on LoCoMo: is what a question needs in the context the model receives?

Each LoCoMo conversation (speaker A as the user, speaker B as the assistant; each session's
date in front of its first message, the way a chat app stamps a session) is driven through the
engine turn by turn with the offline summarizer: ``prepare`` on each user message, ``after_turn``
after each turn. Then every QA item of categories 1–4 (5 has no answer in the conversation) is
asked as the final user message, and the item counts when every content word of the gold
answer is in the prepared messages (the question's own text excluded). Same tokenizer and stop
list for every arm; the questions are used for nothing but that final message.

Arms, at each budget B:
- ``full``: the whole conversation (the ceiling);
- ``truncation``: the newest messages that fit B chars;
- ``window``: the newest messages that fit as many chars as the engine (recall on) sent for
  that question;
- ``engine_no_recall`` / ``engine``: the engine with ``recall_enabled`` false / true;
- ``sessions_no_recall`` / ``sessions``: one engine session per LoCoMo session for the same
  user, each question asked in a fresh session of that user (long-term memory and recall are
  all that can carry the answer).

Data: ../shared/bench-data/locomo (six conversations). ``python -m benchmarks.locomo``; the
results go to ``benchmarks/results/locomo.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import structlog

from ragent_memory import MemoryEngine, Settings, StoreSettings
from ragent_memory.core.chars import chars, text_of
from ragent_memory.settings import RECALL_TURN_CHARS, RecallSettings

ROOT = Path(__file__).resolve().parent.parent
# ../shared/bench-data beside the checkout (or beside its parent, for a git worktree), or
# LOCOMO_DIR.
DATA = next(
    (
        p
        for p in (
            Path(os.environ.get("LOCOMO_DIR", "/nonexistent")),
            ROOT.parent / "shared" / "bench-data" / "locomo",
            ROOT.parent.parent / "shared" / "bench-data" / "locomo",
        )
        if p.is_dir()
    ),
    ROOT.parent / "shared" / "bench-data" / "locomo",
)
RESULTS = Path(__file__).resolve().parent / "results" / "locomo.json"
BUDGETS = (20_000, 40_000)
ARMS = (
    "full",
    "truncation",
    "window",
    "engine_no_recall",
    "engine",
    "sessions_no_recall",
    "sessions",
)
STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "of",
        "to",
        "in",
        "on",
        "at",
        "for",
        "with",
        "by",
        "from",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "it",
        "its",
        "this",
        "that",
        "i",
        "you",
        "he",
        "she",
        "we",
        "they",
        "my",
        "your",
        "her",
        "his",
        "our",
        "their",
        "me",
        "him",
        "them",
        "do",
        "did",
        "does",
        "so",
        "as",
        "but",
        "not",
        "no",
        "what",
        "when",
        "where",
        "who",
        "how",
        "why",
        "which",
    ]
)
WORD = re.compile(r"[a-z0-9]+")

Message = dict[str, Any]


def words(text: str) -> set[str]:
    return {w for w in WORD.findall(text.lower()) if w not in STOP}


def session_numbers(data: dict[str, Any]) -> list[int]:
    return sorted(int(k.split("_")[1]) for k in data if re.fullmatch(r"session_\d+", k) and data[k])


def session_messages(data: dict[str, Any], number: int) -> list[Message]:
    """One LoCoMo session as chat messages, its date stamped on the first."""
    user = data["speaker_a"]
    when = data.get(f"session_{number}_date_time", "")
    out = []
    for k, turn in enumerate(data[f"session_{number}"]):
        text = turn["text"]
        if turn.get("blip_caption"):
            text += f" [shares a photo: {turn['blip_caption']}]"
        prefix = f"[{when}] " if k == 0 and when else ""
        role = "user" if turn["speaker"] == user else "assistant"
        out.append({"role": role, "content": f"{prefix}{turn['speaker']}: {text}"})
    return out


def questions(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [q for q in data["qa"] if q.get("category") in (1, 2, 3, 4) and "answer" in q]


def newest(messages: Sequence[Message], size: int) -> list[Message]:
    kept, total = [], 0
    for message in reversed(messages):
        total += chars(message)
        if total > size:
            break
        kept.append(message)
    return kept[::-1]


def context_text(messages: Iterable[Message], question: str) -> str:
    """Everything the model receives except the question's own words."""
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            parts += [p.get("text", "") for p in content if p.get("text") != question]
        elif content != question:
            parts.append(text_of(message))
    return "\n".join(parts)


def is_kept(context: str, answer: Any) -> bool | None:
    gold = words(str(answer))
    return gold <= words(context) if gold else None


def drive(
    engine: MemoryEngine, messages: Sequence[Message], *, session_id: str, user_id: str
) -> None:
    """What a deployed agent does: prepare on each user message, after_turn after each turn."""
    for index, message in enumerate(messages):
        if message["role"] == "user":
            if index:
                engine.after_turn(messages[:index], session_id=session_id, user_id=user_id)
            engine.prepare(messages[: index + 1], session_id=session_id, user_id=user_id)
    engine.after_turn(messages, session_id=session_id, user_id=user_id)
    engine.flush()


def quiet_logs() -> None:
    """The engine's logs at WARNING and up only: a retention run prints its own table."""
    logging.getLogger("ragent_memory").setLevel(logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def engine_settings(
    budget: int, path: Path, *, recall: bool, turn_chars: int | None = RECALL_TURN_CHARS
) -> Settings:
    """The engine a retention run drives: B, recall on or off, and ``recall.turn_chars`` (the
    default unless ``benchmarks.turn_cap`` tries another)."""
    return Settings(
        context_window_chars=budget,
        recall_enabled=recall,
        store=StoreSettings(path=str(path)),
        recall=RecallSettings(turn_chars=turn_chars),
    )


class Tally:
    def __init__(self) -> None:
        self.kept: dict[str, list[float]] = {arm: [] for arm in ARMS}
        self.sent: dict[str, list[int]] = {arm: [] for arm in ARMS}

    def add(self, arm: str, context: str, answer: Any) -> None:
        kept = is_kept(context, answer)
        if kept is not None:
            self.kept[arm].append(float(kept))
            self.sent[arm].append(len(context))

    def row(self) -> dict[str, Any]:
        return {
            arm: {
                "answers": round(sum(v) / len(v), 4) if v else None,
                "questions": len(v),
                "mean_chars": round(sum(self.sent[arm]) / len(v)) if v else None,
            }
            for arm, v in self.kept.items()
        }


def per_question(data: dict[str, Any], budget: int, tmp: Path, tally: Tally, name: str) -> None:
    messages = [m for n in session_numbers(data) for m in session_messages(data, n)]
    qa = questions(data)
    for q in qa:
        tally.add("full", context_text(messages, ""), q["answer"])
        tally.add("truncation", context_text(newest(messages, budget), ""), q["answer"])
    for recall in (False, True):
        arm = "engine" if recall else "engine_no_recall"
        path = tmp / f"{name}-{budget}-{arm}.db"
        with MemoryEngine(engine_settings(budget, path, recall=recall)) as engine:
            drive(engine, messages, session_id=name, user_id=name)
            for q in qa:
                asked = [*messages, {"role": "user", "content": q["question"]}]
                prepared = engine.prepare(asked, session_id=name, user_id=name)
                context = context_text(prepared.messages, q["question"])
                tally.add(arm, context, q["answer"])
                if recall:
                    window = newest(messages, len(context))
                    tally.add("window", context_text(window, ""), q["answer"])


def drive_sessions(engine: MemoryEngine, data: dict[str, Any], name: str) -> None:
    """Each LoCoMo session of ``data`` driven as its own session of the user ``name``."""
    for number in session_numbers(data):
        drive(engine, session_messages(data, number), session_id=f"{name}-s{number}", user_id=name)


def sessions(data: dict[str, Any], budget: int, tmp: Path, tally: Tally, name: str) -> None:
    qa = questions(data)
    for recall in (False, True):
        arm = "sessions" if recall else "sessions_no_recall"
        path = tmp / f"{name}-{budget}-{arm}.db"
        with MemoryEngine(engine_settings(budget, path, recall=recall)) as engine:
            drive_sessions(engine, data, name)
            for k, q in enumerate(qa):
                asked = [{"role": "user", "content": q["question"]}]
                prepared = engine.prepare(asked, session_id=f"{name}-q{k}", user_id=name)
                tally.add(arm, context_text(prepared.messages, q["question"]), q["answer"])


def table(results: dict[str, Any]) -> str:
    lines = [
        "| B | " + " | ".join(ARMS) + " |",
        "| --- | " + " | ".join("---" for _ in ARMS) + " |",
    ]
    for budget, row in results["mean"].items():
        cells = [f"{row[arm]['answers']:.3f}" for arm in ARMS]
        lines.append(f"| {int(budget):,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conv", action="append", help="only these conversations (conv-26…)")
    parser.add_argument("--budget", type=int, action="append", help="only these budgets")
    parser.add_argument("--no-write", action="store_true", help="do not write the JSON")
    args = parser.parse_args(argv)
    quiet_logs()
    files = sorted(DATA.glob("conv-*.json"))
    if args.conv:
        files = [f for f in files if f.stem in args.conv]
    if not files:
        print(f"LoCoMo data not found under {DATA}; skipping the retention benchmark")
        return
    budgets = tuple(args.budget or BUDGETS)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks.locomo", *(argv or sys.argv[1:])]),
        "scoring": "answers: share of questions whose gold answer's content words are all in "
        "the context; mean: pooled over every scored question of the conversations run",
        "conversations": [f.stem for f in files],
        "per_conv": {},
        "mean": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for budget in budgets:
            overall = Tally()
            for path in files:
                data = json.loads(path.read_text())
                tally = Tally()
                per_question(data, budget, Path(tmp), tally, path.stem)
                sessions(data, budget, Path(tmp), tally, path.stem)
                for arm in ARMS:
                    overall.kept[arm] += tally.kept[arm]
                    overall.sent[arm] += tally.sent[arm]
                row = tally.row()
                results["per_conv"].setdefault(str(budget), {})[path.stem] = row
                print(
                    f"B={budget:>6,} {path.stem}: "
                    + "  ".join(f"{arm} {row[arm]['answers']:.2f}" for arm in ARMS),
                    flush=True,
                )
            results["mean"][str(budget)] = overall.row()
    results["seconds"] = round(time.perf_counter() - started, 1)
    print("\nLoCoMo, answers kept (every content word of the gold answer in the context):\n")
    finish(results, table(results), ARMS, None if args.no_write else RESULTS)


def finish(results: dict[str, Any], shown: str, arms: Sequence[str], path: Path | None) -> None:
    """Print a retention run's table and mean sizes; write its results to ``path`` (None:
    don't)."""
    print(shown)
    for budget, row in results["mean"].items():
        sizes = ", ".join(f"{arm} {row[arm]['mean_chars'] or 0:,}" for arm in arms)
        print(f"mean context chars at B={int(budget):,}: {sizes}")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
