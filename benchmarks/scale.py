"""``make bench``: recall's cost as one user's history grows (docs/design.md §17).

Two measurements, recall on:

- **one user, growing**: synthetic chat (seeded; a Zipf-distributed vocabulary with names,
  places and dates, 50-turn sessions) indexed for one user up to 100,000 messages; at each
  size, ``prepare`` of a fresh question in a new session of that user (its words drawn from
  the same vocabulary, so its postings grow with the history): p50/p99, the process's RSS and
  the in-process index's bytes per indexed message (``RecallMirror.memory``), and what
  grows besides: the top-k's own CPU time and the excerpts a question shows;
- **long sessions**: the 2,000- and 8,000-turn RAG sessions of ``benchmarks.versus``
  (``simulate_session``), last-100 ÷ turns-100–200 of ``prepare``'s CPU time, and last-100 ÷
  the 100 turns before the midpoint (twice the history, recall in its steady state).

Results go to ``benchmarks/results/scale.json``. ``python -m benchmarks.scale [--quick]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog

from ragent_memory import MemoryEngine, Settings, StoreSettings
from ragent_memory.cli.demo import simulate_session
from ragent_memory.recall.excerpts import CANDIDATES
from ragent_memory.recall.rank import query_keys
from ragent_memory.text.terms import search_terms

RESULTS = Path(__file__).resolve().parent / "results" / "scale.json"
SIZES = (1_000, 3_000, 10_000, 30_000, 100_000)
QUICK_SIZES = (1_000, 3_000, 10_000)
SESSION_TURNS = 50  # turns per session: 100 indexed messages
QUESTIONS = 200  # fresh questions asked at each size
BUDGET = 200_000
NAMES = ("Caroline", "Melanie", "Jon", "Gina", "Tim", "John", "Maria", "Joanna", "Nate", "Audrey")
FILLER = (
    "i think that was really great and we should do it again sometime soon",
    "oh wow that sounds amazing tell me more about it",
    "yeah it has been a busy week at work but things are good",
    "thanks so much for asking how about you",
)


def vocabulary(size: int, rng: random.Random) -> list[str]:
    """Made-up words (pronounceable, distinct), the corpus's content words."""
    consonants, vowels = "bcdfghjklmnprstvwz", "aeiou"
    words: dict[str, None] = {}
    while len(words) < size:
        length = rng.randint(2, 4)
        word = "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(length))
        words[word] = None
    return list(words)


class Chat:
    """A seeded chat generator: sentences of Zipf-distributed content words among names,
    filler and the odd date."""

    def __init__(self, seed: int = 35, words: int = 20_000) -> None:
        self.rng = random.Random(seed)
        self.words = vocabulary(words, self.rng)
        self.weights = [1.0 / (rank + 1) ** 1.07 for rank in range(words)]

    def content(self, count: int) -> list[str]:
        return self.rng.choices(self.words, weights=self.weights, k=count)

    def message(self) -> str:
        rng = self.rng
        parts = [f"{rng.choice(NAMES)}:"]
        for _ in range(rng.randint(1, 3)):
            parts.append(" ".join(self.content(rng.randint(4, 14))) + ".")
        if rng.random() < 0.3:
            parts.append(rng.choice(FILLER) + "!")
        if rng.random() < 0.05:
            parts.append(f"That was on {rng.randint(1, 28)} May {rng.randint(2019, 2024)}.")
        return " ".join(parts)

    def session(self, number: int) -> list[dict[str, Any]]:
        messages = []
        for turn in range(SESSION_TURNS):
            text = self.message()
            if not turn:
                text = f"[1:{number % 60:02d} pm on {number % 28 + 1} May 2023] {text}"
            messages.append({"role": "user", "content": text})
            messages.append({"role": "assistant", "content": self.message()})
        return messages

    def question(self) -> str:
        words = " ".join(self.content(self.rng.randint(2, 5)))
        return f"What did {self.rng.choice(NAMES)} say about {words}?"


def grow(engine: MemoryEngine, chat: Chat, sessions: range) -> None:
    """Index ``sessions`` of the user (``after_turn`` with the whole session, as an app does
    at its end), then wait for the index."""
    for number in sessions:
        engine.after_turn(chat.session(number), session_id=f"s{number}", user_id="u")
    engine.flush()


def rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as statm:
        pages = int(statm.read().split()[1])
    return pages * 4096 / 1e6


def agreement(engine: MemoryEngine, question: str) -> tuple[bool, float, float] | None:
    """Whether the mirror's top 40 for ``question`` matches the exhaustive BM25 ranking
    (every block read) exactly, its recall@40 against it, and the CPU ms of the ranking
    alone (the top-k, without the second hop, the texts and the excerpts). It reads the
    engine's in-process index directly: the one place a benchmark looks inside."""
    mirror = engine.recaller.mirror  # type: ignore[union-attr]
    unit = mirror._units.get(("u", "u"))
    if unit is None:
        return None
    keys = query_keys(search_terms(question), mirror.stem)
    ask = {"session_id": "-", "visible_from": 0, "shown": (), "limit": CANDIDATES}
    started = time.process_time()
    found = unit.rank(keys, **ask)
    ranking = (time.process_time() - started) * 1000
    every = unit.rank(keys, budget=1 << 40, **ask)
    if not every:
        return None
    same = {row for row, _ in found} & {row for row, _ in every}
    return found == every, len(same) / len(every), ranking


def asked(engine: MemoryEngine, chat: Chat, size: int) -> dict[str, Any]:
    """``prepare`` of fresh questions, each in a new session of the user; then how the
    bounded ranking compares with the exhaustive one on them."""
    timings, recalled, shown, questions = [], 0, [], []
    for k in range(QUESTIONS):
        questions.append(chat.question())
        messages = [
            {"role": "system", "content": "You are a friendly companion."},
            {"role": "user", "content": questions[-1]},
        ]
        started = time.process_time()
        prepared = engine.prepare(messages, session_id=f"q{size}-{k}", user_id="u")
        timings.append((time.process_time() - started) * 1000)
        recalled += prepared.report.recalled > 0
        shown.append(prepared.report.recalled)
    timings.sort()
    memory = engine.recall_memory()
    compared = [c for c in map(functools.partial(agreement, engine), questions) if c]
    return {
        "indexed": size,
        "p50_ms": statistics.median(timings),
        "p99_ms": timings[int(len(timings) * 0.99) - 1],
        "answered_share": recalled / QUESTIONS,
        "rss_mb": rss_mb(),
        "index_bytes": memory["bytes"],
        "index_bytes_per_message": memory["bytes"] / max(memory["rows"], 1),
        "index_cap_bytes": memory["cap"],
        "exact_share": sum(exact for exact, _, _ in compared) / max(len(compared), 1),
        "recall_at_k": statistics.mean(r for _, r, _ in compared) if compared else 1.0,
        # what grows besides the ranking: the excerpts a question finds and renders
        "rank_p50_ms": statistics.median(ms for _, _, ms in compared) if compared else 0.0,
        "excerpts_mean": statistics.mean(shown),
    }


def growing(sizes: tuple[int, ...], tmp: Path) -> list[dict[str, Any]]:
    settings = Settings(
        context_window_chars=BUDGET,
        store=StoreSettings(path=str(tmp / "grow.db")),
        long_term_enabled=False,
    )
    chat, rows, done = Chat(), [], 0
    with MemoryEngine(settings) as engine:
        for size in sizes:
            grow(engine, chat, range(done, size // (2 * SESSION_TURNS)))
            done = size // (2 * SESSION_TURNS)
            rows.append(asked(engine, chat, size))
            row = rows[-1]
            print(
                f"{size:>8,} {row['p50_ms']:>8.3f} {row['p99_ms']:>8.3f} {row['rss_mb']:>8.1f} "
                f"{row['index_bytes_per_message']:>10.0f} {row['exact_share']:>6.2f} "
                f"{row['recall_at_k']:>9.3f} {row['rank_p50_ms']:>8.3f} "
                f"{row['excerpts_mean']:>8.1f}",
                flush=True,
            )
    return rows


def long_session(turns: int, seed: int, budget: int, tmp: Path) -> dict[str, Any]:
    """A RAG session of ``turns`` turns, recall on: ``prepare``'s CPU ms per turn."""
    settings = Settings(
        context_window_chars=budget, store=StoreSettings(path=str(tmp / f"long{turns}.db"))
    )
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a support agent."}]
    timings, own, recalled = [], [], []
    with MemoryEngine(settings) as engine:
        for messages in simulate_session(turns, seed=seed):
            history.append(messages[0])
            started, mine = time.process_time(), time.thread_time()
            prepared = engine.prepare(history, session_id="long")
            timings.append((time.process_time() - started) * 1000)
            own.append((time.thread_time() - mine) * 1000)
            recalled.append(prepared.report.recalled)
            history.extend(messages[1:])
            engine.after_turn(history, session_id="long")
    half = turns // 2  # the mid window: the 100 turns before the session's midpoint
    early, late = statistics.median(timings[100:200]), statistics.median(timings[-100:])
    own_early, own_late = statistics.median(own[100:200]), statistics.median(own[-100:])
    own_mid = statistics.median(own[half - 100 : half])
    return {
        "turns": turns,
        "context_window_chars": budget,
        "early_p50_ms": early,
        "late_p50_ms": late,
        "late_over_early": late / early,
        # the caller's thread only: without the recall indexer's work on the previous turn,
        # which back-to-back turns land inside the next prepare (a model call's time would not)
        "thread_early_p50_ms": own_early,
        "thread_late_p50_ms": own_late,
        "thread_late_over_early": own_late / own_early,
        "early_recalled": statistics.mean(recalled[100:200]),
        "late_recalled": statistics.mean(recalled[-100:]),
        # Twice the history at the same recall work: the last 100 turns against the 100
        # before the midpoint (the early window can come before anything left the view,
        # when recall has little to show: its ratio then counts excerpts, not history).
        "mid_p50_ms": statistics.median(timings[half - 100 : half]),
        "late_over_mid": late / statistics.median(timings[half - 100 : half]),
        "thread_late_over_mid": own_late / own_mid,
        "mid_recalled": statistics.mean(recalled[half - 100 : half]),
    }


def sessions(quick: bool, tmp: Path) -> Iterator[dict[str, Any]]:
    scale = 4 if quick else 1
    for turns, seed, budget in ((2_000, 42, 200_000), (8_000, 8, 1_000_000)):
        row = long_session(turns // scale, seed, budget, tmp)
        print(
            f"{row['turns']:>6,} turns, B = {budget:,}: early {row['early_p50_ms']:.3f} ms, "
            f"late {row['late_p50_ms']:.3f} ms, late/early {row['late_over_early']:.2f} "
            f"(caller's thread {row['thread_late_over_early']:.2f}) "
            f"(excerpts recalled: {row['early_recalled']:.1f} early, {row['mid_recalled']:.1f} mid, "
            f"{row['late_recalled']:.1f} late); late/mid {row['late_over_mid']:.2f} "
            f"(caller's thread {row['thread_late_over_mid']:.2f})",
            flush=True,
        )
        yield row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, shorter sessions")
    parser.add_argument("--part", choices=("grow", "sessions"), action="append")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    parts = args.part or ["grow", "sessions"]
    started = time.perf_counter()
    payload: dict[str, Any] = {"benchmark": "scale", "command": "python -m benchmarks.scale"}
    with tempfile.TemporaryDirectory() as tmp:
        if "grow" in parts:
            print("one user, growing: prepare of a fresh question, recall on (CPU ms)")
            print(
                f"{'indexed':>8} {'p50 ms':>8} {'p99 ms':>8} {'RSS MB':>8} {'bytes/msg':>10} "
                f"{'exact':>6} {'recall@40':>9} {'rank ms':>8} {'excerpts':>8}"
            )
            grown = growing(QUICK_SIZES if args.quick else SIZES, Path(tmp))
            payload["growing"] = grown
            payload["p50_last_over_first"] = grown[-1]["p50_ms"] / grown[0]["p50_ms"]
            print(
                f"p50 at {grown[-1]['indexed']:,} ÷ at {grown[0]['indexed']:,}: "
                f"{payload['p50_last_over_first']:.2f}"
            )
        if "sessions" in parts:
            print("\nlong RAG sessions, recall on: last-100 ÷ turns 100–200")
            payload["sessions"] = list(sessions(args.quick, Path(tmp)))
    payload["seconds"] = round(time.perf_counter() - started, 1)
    if not args.quick:  # one part run: the other's results kept
        if len(parts) == 1 and RESULTS.exists():
            payload = {**json.loads(RESULTS.read_text(encoding="utf-8")), **payload}
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        print(f"\nwritten: {RESULTS}")


if __name__ == "__main__":
    main()
