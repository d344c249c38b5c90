"""Why recall misses on BEAM: each question whose gold answer (scored as ``benchmarks.beam``
scores it) is in the full chat but not in what ``prepare`` sent, classified by where it was
lost.

The answer's *holders* are the messages whose words hold every content word of the gold
answer. A miss is:

- ``scattered, found``: no one message holds the whole answer, but the texts of the hits and
  their neighbours do (the pieces were found, and cut or left out for room);
- ``scattered``: no one message holds it and the hits' texts do not either (a list gathered
  over many sessions, an answer worked out from several values);
- ``cut``: a holder is in the block but its excerpt was clipped past the answer;
- ``room``: a holder was among the search's hits but its excerpt did not fit the block;
- ``neighbour``: a holder is two or more messages from a shown hit;
- ``no shared word``: a holder shares no search term (stemmed) with the question;
- ``ranked out``: a holder shares words but was not among the hits.

Each class is split by BEAM's kind of question.
``python -m benchmarks.beam_misses [--protocol sessions|question] [--chat 1] [--show N]``; run
whole (both protocols, every chat) it writes ``benchmarks/results/beam_misses.json``, which
docs/benchmarks.md shows.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.beam import DATA, chat_questions, chat_sessions, gold_words, words
from benchmarks.locomo import drive, engine_settings, quiet_logs
from benchmarks.locomo_misses import Spy, in_block, lost_words, report, stems
from ragent_memory import MemoryEngine

RESULTS = Path(__file__).resolve().parent / "results" / "beam_misses.json"
# "question": the question at the end of the whole chat, one session (the engine arm);
# "sessions": each session driven as its own, the question in a new one (the fresh session)
PROTOCOLS = ("question", "sessions")


def classify(gold: set[str], question: str, said: list[str], spy: Spy) -> tuple[str, str]:
    """The miss's class and the holder it names ("" when none)."""
    holders = [text for text in said if gold <= words(text)]
    if not holders:
        found = [m.content for e in spy.excerpts for m in e.messages] + [
            h.content for h in spy.hits
        ]
        return ("scattered, found" if gold <= words("\n".join(found)) else "scattered"), ""
    hit_texts = [h.content for h in spy.hits]
    shown = in_block(holders, spy)
    if shown is not None:
        return shown
    near = {i for i, text in enumerate(said) if text in hit_texts}
    for holder in holders:
        at = said.index(holder)
        if any(abs(at - i) <= 3 for i in near):
            return "neighbour", holder
    asked = stems(question)
    for holder in holders:
        if asked & stems(holder):
            return "ranked out", holder
    return "no shared word", holders[0]


def run(protocol: str, budget: int, show: int, chats: Sequence[str]) -> dict[str, Any]:
    """Classify the misses of ``protocol`` over ``chats`` (all when empty); print the table
    and return it as ``{"answerable", "missed", "classes": {class: {kind: count}}}``."""
    spy = Spy()
    table: Counter[str] = Counter()
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    examples: dict[str, list[str]] = defaultdict(list)
    total = missed = 0
    dirs = sorted((p for p in DATA.glob("*") if p.is_dir()), key=lambda p: int(p.name))
    with tempfile.TemporaryDirectory() as tmp:
        for chat in (d for d in dirs if not chats or d.name in chats):
            sessions = chat_sessions(json.loads((chat / "chat.json").read_text()))
            every = [m for s in sessions for m in s]
            said = [m["content"] for m in every]
            full = words("\n".join(said))
            name = f"beam-{chat.name}"
            settings = engine_settings(budget, Path(tmp) / f"{name}.db", recall=True)
            with MemoryEngine(settings) as engine:
                if protocol == "question":
                    drive(engine, every, session_id=name, user_id=name)
                else:
                    for k, session in enumerate(sessions):
                        drive(engine, session, session_id=f"{name}-b{k + 1}", user_id=name)
                for k, q in enumerate(chat_questions(chat / "probing_questions.json")):
                    gold = gold_words(q["answer"], q["question"])
                    if not gold or not gold <= full:
                        continue
                    total += 1
                    ask = (protocol, every, name, f"{name}-q{k}")
                    lost = sorted(lost_words(engine, spy, ask, q["question"], gold, words))
                    if not lost:
                        continue
                    missed += 1
                    kind, holder = classify(gold, q["question"], said, spy)
                    table[kind] += 1
                    by_kind[kind][q["kind"]] += 1
                    examples[kind].append(
                        f"  [{q['kind'][:12]}] {q['question'][:110]} | lost {lost[:8]}"
                        f" | {holder[:100]!r}"
                    )
    line = f"{protocol}, B={budget:,}: {total} answerable"
    short = {k: {kind[:12]: n for kind, n in v.items()} for k, v in by_kind.items()}
    report(line, missed, total, table, short, examples, show)
    classes = {k: dict(by_kind[k]) for k, _ in table.most_common()}
    return {"answerable": total, "missed": missed, "classes": classes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--protocol", choices=PROTOCOLS, action="append", help="only these (default: both)"
    )
    parser.add_argument("--budget", type=int, default=20_000)
    parser.add_argument("--show", type=int, default=0)
    parser.add_argument("--chat", action="append", default=[])
    parser.add_argument("--no-write", action="store_true", help="do not write the JSON")
    args = parser.parse_args()
    quiet_logs()
    if not any(p.is_dir() for p in DATA.glob("*")):
        print(f"BEAM data not found under {DATA}; skipping")
        return
    started = time.perf_counter()
    protocols = args.protocol or list(PROTOCOLS)
    results: dict[str, Any] = {"budget": args.budget, "protocols": {}}
    for protocol in protocols:
        results["protocols"][protocol] = run(protocol, args.budget, args.show, args.chat)
    results["seconds"] = round(time.perf_counter() - started, 1)
    # Only a whole run (every chat, both protocols) is written: the docs read the file.
    if not args.no_write and not args.chat and len(protocols) == len(PROTOCOLS):
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwritten: {RESULTS}")


if __name__ == "__main__":
    main()
