"""Why recall misses on LoCoMo: each question whose gold answer is in the full history but not
in what ``prepare`` sent, classified by where the answer was lost.

The answer's *holders* are the messages whose words (relative time anchored, as recall shows
them) hold every content word of the gold answer (the benchmark's tokenizer and stop list),
the question's evidence turns first. A miss is:

- ``scattered``: no one message holds the whole answer (a list gathered from many turns, or a
  date made of a session's stamp and a relative "yesterday"); ``scattered, when`` for a "when"
  question;
- ``cut``: a holder is in the block but its excerpt was clipped past the answer;
- ``room``: a holder was among the search's hits but its excerpt did not fit the block;
- ``neighbour``: a holder is two or more messages from a shown hit;
- ``no shared word``: a holder shares no search term (stemmed) with the question (paraphrase);
- ``ranked out``: a holder shares words but was not among the hits (common words, or weaker
  matches ranking first).

Each class is split by LoCoMo category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop).
``python -m benchmarks.locomo_misses [--protocol question|sessions] [--budget 20000]``;
prints a table and, with ``--show N``, N examples per class.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ragent_memory.recall.excerpts as excerpts
from benchmarks.locomo import (
    DATA,
    context_text,
    drive,
    drive_sessions,
    engine_settings,
    questions,
    quiet_logs,
    session_messages,
    session_numbers,
    words,
)
from ragent_memory import MemoryEngine
from ragent_memory.text.porter import stem
from ragent_memory.text.relative import anchored
from ragent_memory.text.terms import search_terms


class Spy:
    """What ``find_block`` found on its last call: the hits and the excerpts rendered."""

    def __init__(self) -> None:
        self.hits: list[Any] = []
        self.excerpts: list[Any] = []
        self.block = ""
        search, fill = excerpts._search, excerpts._fill

        def spied_search(*args: Any, **kwargs: Any) -> Any:
            found = search(*args, **kwargs)
            self.hits = list(found[0])
            return found

        def spied_fill(found: Sequence[Any], ask: Any, *args: Any) -> Any:
            made = fill(found, ask, *args)
            self.block = made.text
            self.excerpts = list(found)
            return made

        excerpts._search = spied_search  # type: ignore[assignment]
        excerpts._fill = spied_fill  # type: ignore[assignment]

    def reset(self) -> None:
        self.hits, self.block, self.excerpts = [], "", []


def stems(text: str) -> set[str]:
    return {stem(t) for t in search_terms(text, limit=10_000)}


def dia(dia_id: str) -> tuple[int, int]:
    s, t = dia_id.strip("D").split(":")
    return int(s), int(t)


def classify(
    q: dict[str, Any], by_text: dict[str, str], said: dict[str, str], spy: Spy
) -> tuple[str, str]:
    """The miss's class and the holder it names ("" when none)."""
    gold = words(str(q["answer"]))
    evidence = set(q.get("evidence") or [])
    holders = [t for t in by_text if gold <= words(said[t])]
    holders.sort(key=lambda t: by_text[t] not in evidence)
    when = excerpts.asks_when(q["question"])
    if not holders:
        return ("scattered, when" if when else "scattered"), ""
    hit_texts = [h.content for h in spy.hits]
    shown = in_block(holders, spy)
    if shown is not None:
        kind, holder = shown
        if kind == "room":
            rank = hit_texts.index(holder) + 1 if holder in hit_texts else 0
            kind = f"room (hit {rank}/{len(hit_texts)})"
        return kind, holder
    places = [dia(by_text[h]) for h in hit_texts if h in by_text]
    for holder in holders:
        s, t = dia(by_text[holder])
        if any(s == s2 and abs(t - t2) <= 3 for s2, t2 in places):
            return "neighbour", holder
    asked = stems(q["question"])
    for holder in holders:
        if not asked & stems(holder):
            continue
        return ("ranked out, when" if when else "ranked out"), holder
    return ("no shared word, when" if when else "no shared word"), holders[0]


def in_block(holders: Sequence[str], spy: Spy) -> tuple[str, str] | None:
    """For the first holder among the excerpts the search found: "cut" when its head is in
    the block (shown, clipped past the answer), "room" when it is not (it did not fit); None
    when no holder was found."""
    in_excerpts = {m.content for e in spy.excerpts for m in e.messages}
    for holder in holders:
        if holder in in_excerpts:
            return ("cut" if " ".join(holder.split())[:60] in spy.block else "room"), holder
    return None


def lost_words(
    engine: MemoryEngine,
    spy: Spy,
    ask: tuple[str, list[dict[str, Any]], str, str],
    question: str,
    gold: set[str],
    split: Callable[[str], set[str]] = words,
) -> set[str]:
    """The gold words (as ``split`` reads a text) ``question`` lost, asked as the protocol of
    ``ask`` says (``(protocol, every message said, the session's name, the question's
    session)``): at the end of the whole conversation ("question"), or alone in a session of
    its own."""
    protocol, every, name, own = ask
    spy.reset()
    asked = {"role": "user", "content": question}
    msgs, sid = ([*every, asked], name) if protocol == "question" else ([asked], own)
    prepared = engine.prepare(msgs, session_id=sid, user_id=name)
    return gold - split(context_text(prepared.messages, question))


def report(
    head: str,
    missed: int,
    total: int,
    table: Counter[str],
    by: dict[str, dict[str, int]],
    examples: dict[str, list[str]],
    show: int,
) -> None:
    """The miss table: one row a class, most common first, with its count by question kind
    and up to ``show`` examples."""
    print(f"{head}, {missed} missed ({missed / total:.1%})")
    width = max((len(kind) for kind in table), default=0) + 2
    for kind, count in table.most_common():
        kinds = " ".join(f"{k}:{n}" for k, n in sorted(by.get(kind, {}).items()))
        print(f"{count:5d}  {kind:{width}s} {kinds}")
        for line in examples.get(kind, [])[:show]:
            print(line)


def run(protocol: str, budget: int, show: int, convs: Sequence[str], verbose: bool = False) -> None:
    quiet_logs()
    spy = Spy()
    table: Counter[str] = Counter()
    by_cat: dict[str, Counter[int]] = defaultdict(Counter)
    examples: dict[str, list[str]] = defaultdict(list)
    total = missed = 0
    files = sorted(DATA.glob("conv-*.json"))
    files = [f for f in files if not convs or f.stem in convs]
    with tempfile.TemporaryDirectory() as tmp:
        for path in files:
            data = json.loads(path.read_text())
            name = path.stem
            by_text, said = {}, {}  # a message's text → its turn id, its text as recalled
            for n in session_numbers(data):
                for m, turn in zip(session_messages(data, n), data[f"session_{n}"], strict=True):
                    by_text[m["content"]] = turn["dia_id"]
                    said[m["content"]] = anchored(m["content"], data[f"session_{n}_date_time"])
            full = "\n".join(by_text)
            settings = engine_settings(budget, Path(tmp) / f"{name}.db", recall=True)
            with MemoryEngine(settings) as engine:
                if protocol == "question":
                    every = [m for n in session_numbers(data) for m in session_messages(data, n)]
                    drive(engine, every, session_id=name, user_id=name)
                else:
                    drive_sessions(engine, data, name)
                for k, q in enumerate(questions(data)):
                    gold = words(str(q["answer"]))
                    if not gold or not gold <= words(full):
                        continue
                    total += 1
                    ask = (protocol, every, name, f"{name}-q{k}")
                    if not lost_words(engine, spy, ask, q["question"], gold):
                        continue
                    missed += 1
                    kind, holder = classify(q, by_text, said, spy)
                    table[kind.split(" (")[0]] += 1
                    by_cat[kind.split(" (")[0]][q["category"]] += 1
                    examples[kind.split(" (")[0]].append(
                        f"  [{q['category']}] {q['question']} -> {q['answer']} | {kind} | {holder[:160]!r}"
                        + (
                            "".join(f"\n      hit: {h.content[:130]!r}" for h in spy.hits[:8])
                            if verbose
                            else ""
                        )
                    )
    line = f"{protocol}, B={budget:,}: {total} answerable"
    report(
        line,
        missed,
        total,
        table,
        {k: {f"c{c}": n for c, n in v.items()} for k, v in by_cat.items()},
        examples,
        show,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--protocol", choices=("question", "sessions"), default="question")
    parser.add_argument("--budget", type=int, default=20_000)
    parser.add_argument("--show", type=int, default=0)
    parser.add_argument("--conv", action="append", default=[])
    parser.add_argument("--hits", action="store_true", help="print each example's best hits")
    args = parser.parse_args()
    run(args.protocol, args.budget, args.show, args.conv, args.hits)


if __name__ == "__main__":
    main()
