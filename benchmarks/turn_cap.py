"""What ``recall.turn_chars`` trades: retention against the prompt cache.

docs/design.md §9b sizes a turn's recall block "up to the room the view leaves ... so a budget
the user allowed is not left idle", and §17 asks a cached-prefix share ≥ 0.95 per model call
with recall on. Each char of a new block is input the provider has not cached, so the two pull
apart; ``recall.turn_chars`` caps the blocks of a session's later turns between them (its
default, 16,000, is the largest cap this measured that keeps the share per model call).
For each cap tried (8,000, 16,000, none):

- **retention**: the engine arm of ``benchmarks.beam`` and ``benchmarks.locomo`` (the chat
  driven turn by turn, each question asked at its end, scored as those benchmarks score it) at
  B = 20,000 and 40,000, with the mean chars of the question's recall block;
- **the cache**: the cached-prefix share of ``benchmarks.versus``'s three recall workloads
  (B = 200,000), one call a turn and a call before every model call (``every_call``).

Same data, summarizer and budgets for every cap; only the cap differs.
``python -m benchmarks.turn_cap [--cap 8000 --cap none] [--quick] [--no-write]`` (``--quick``:
a quarter of each versus workload, two chats of each dataset); a whole run writes
``benchmarks/results/turn_cap.json``, which docs/benchmarks.md shows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import beam, locomo, versus
from ragent_memory import MemoryEngine

RESULTS = Path(__file__).resolve().parent / "results" / "turn_cap.json"
CAPS: tuple[int | None, ...] = (8_000, 16_000, None)
BUDGETS = (20_000, 40_000)
QUICK_CHATS = 2  # chats of each dataset a quick run drives


def cap_name(cap: int | None) -> str:
    return "none" if cap is None else str(cap)


def beam_kept(cap: int | None, budget: int, chats: Sequence[Path], tmp: Path) -> dict[str, Any]:
    """BEAM's engine arm with ``cap``: the answers kept, the mean block and what was sent."""
    tally = beam.Tally()
    for chat in chats:
        sessions = beam.chat_sessions(json.loads((chat / "chat.json").read_text()))
        qa = beam.chat_questions(chat / "probing_questions.json")
        name = f"beam{chat.name}-{budget}-{cap_name(cap)}"
        tally.merge(beam.run_chat(sessions, qa, budget, tmp, name, ("engine",), cap))
    row = tally.row()["engine"]
    return {k: row.get(k) for k in ("answers", "questions", "mean_chars", "mean_block_chars")}


def locomo_kept(cap: int | None, budget: int, files: Sequence[Path], tmp: Path) -> dict[str, Any]:
    """LoCoMo's engine arm (recall on) with ``cap``, scored per question as it scores it."""
    kept: list[bool] = []
    blocks: list[int] = []
    for path in files:
        data = json.loads(path.read_text())
        numbers = locomo.session_numbers(data)
        messages = [m for n in numbers for m in locomo.session_messages(data, n)]
        settings = locomo.engine_settings(
            budget, tmp / f"{path.stem}-{budget}-{cap_name(cap)}.db", recall=True, turn_chars=cap
        )
        with MemoryEngine(settings) as engine:
            locomo.drive(engine, messages, session_id=path.stem, user_id=path.stem)
            for q in locomo.questions(data):
                asked = [*messages, {"role": "user", "content": q["question"]}]
                prepared = engine.prepare(asked, session_id=path.stem, user_id=path.stem)
                verdict = locomo.is_kept(
                    locomo.context_text(prepared.messages, q["question"]), q["answer"]
                )
                if verdict is not None:
                    kept.append(verdict)
                    blocks.append(prepared.report.recalled_chars)
    return {
        "answers": round(sum(kept) / len(kept), 4) if kept else None,
        "questions": len(kept),
        "mean_block_chars": round(statistics.fmean(blocks)) if blocks else None,
    }


Workloads = Sequence[tuple[str, int, versus.Turns]]


def recall_workloads(quick: bool) -> Workloads:
    """versus's workloads that it also runs with a call before every model call."""
    return [w for w in versus.workloads(quick) if w[0] in versus.EVERY_CALL]


def shares(cap: int | None, workloads: Workloads, tmp: Path) -> dict[str, Any]:
    """The cached-prefix share of ``workloads`` with ``cap``, one call a turn (``per_turn``)
    and a call before every model call (``per_model_call``)."""
    out: dict[str, Any] = {}
    for name, budget, turns in workloads:
        row: dict[str, Any] = {"budget": budget}
        for key, every_call in (("per_turn", False), ("per_model_call", True)):
            _, _, extra = versus.run_ragent(
                turns,
                budget,
                versus.language_of(name),
                tmp / f"{name}-{key}-{cap_name(cap)}.db",
                every_call=every_call,
                turn_chars=cap,
            )
            row[key] = round(extra["stability"]["mean_matching_share"], 4)
            row[f"{key}_block_chars"] = round(extra["recalled_chars_per_call"])
        out[name] = row
    return out


def run(
    caps: Sequence[int | None],
    beam_chats: Sequence[Path],
    locomo_files: Sequence[Path],
    workloads: Workloads,
    budgets: Sequence[int] = BUDGETS,
) -> dict[str, Any]:
    """Every cap over the same chats, conversations, budgets and workloads."""
    results: dict[str, Any] = {"caps": {}}
    for cap in caps:
        row: dict[str, Any] = {"beam": {}, "locomo": {}}
        with tempfile.TemporaryDirectory() as tmp:
            for budget in budgets:
                row["beam"][str(budget)] = beam_kept(cap, budget, beam_chats, Path(tmp))
                row["locomo"][str(budget)] = locomo_kept(cap, budget, locomo_files, Path(tmp))
            row["cache"] = shares(cap, workloads, Path(tmp))
        results["caps"][cap_name(cap)] = row
        print(line(cap_name(cap), row), flush=True)
    return results


def line(cap: str, row: dict[str, Any]) -> str:
    kept = "  ".join(
        f"{data} B={int(budget) // 1000}k {figures['answers']:.3f} "
        f"(block {figures['mean_block_chars'] or 0:,})"
        for data in ("beam", "locomo")
        for budget, figures in row[data].items()
    )
    cached = "  ".join(
        f"{name} {r['per_turn']:.3f}/{r['per_model_call']:.3f}" for name, r in row["cache"].items()
    )
    return f"cap {cap:>6}: {kept}\n             shares per turn/per model call: {cached}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cap", action="append", help="caps to try (chars, or 'none')")
    parser.add_argument("--quick", action="store_true", help="quarter workloads, two chats each")
    parser.add_argument("--no-write", action="store_true", help="do not write the JSON")
    args = parser.parse_args(argv)
    caps = (
        [None if c.lower() in ("none", "null") else int(c) for c in args.cap] if args.cap else CAPS
    )
    locomo.quiet_logs()
    chats = sorted((p for p in beam.DATA.glob("*") if p.is_dir()), key=lambda p: int(p.name))
    files = sorted(locomo.DATA.glob("conv-*.json"))
    if args.quick:
        chats, files = chats[:QUICK_CHATS], files[:QUICK_CHATS]
    if not chats or not files:
        raise SystemExit(f"no BEAM chats in {beam.DATA} or LoCoMo files in {locomo.DATA}")
    started = time.perf_counter()
    results = {
        "benchmark": "turn_cap",
        "command": " ".join(
            ["python -m benchmarks.turn_cap", *(sys.argv[1:] if argv is None else argv)]
        ),
        "quick": args.quick,
        "beam_chats": [c.name for c in chats],
        "locomo_conversations": [f.stem for f in files],
        **run(caps, chats, files, recall_workloads(args.quick)),
        "seconds": round(time.perf_counter() - started, 1),
    }
    if args.no_write or args.quick or args.cap:
        print("written: nothing (a quick or partial run)")
        return
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written: {RESULTS}")


if __name__ == "__main__":
    main()
