"""``make bench``: prepare() cost per turn, measured side by side in one run.

Three ways an app can call the engine on a growing RAG session:

- incremental: the app appends to one list and passes the same dicts again (the usual case);
- fresh system: the app builds a new system message every turn (a timestamp, say) and passes
  the same history dicts after it;
- rebuilt: the app rebuilds its dicts every turn (from a DB), so every message is re-hashed;
- cold: a new engine per turn on the same store (a restart before every turn).

Numbers are ratios against the incremental path, measured in the same process, so a noisy
shared machine moves them all together. Results go to ``benchmarks/results/run.json``.
"""

from __future__ import annotations

import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog

from ragent_memory import Settings, StoreSettings
from ragent_memory.cli.demo import simulate_session
from ragent_memory.engine.memory_engine import MemoryEngine

RESULTS = Path(__file__).resolve().parent / "results" / "run.json"


def run(mode: str, turns: list[list[dict[str, Any]]], budget: int, db: Path) -> list[float]:
    settings = Settings(context_window_chars=budget, store=StoreSettings(path=str(db)))
    history: list[dict[str, Any]] = []
    timings = []
    engine = MemoryEngine(settings)
    try:
        for messages in turns:
            history.append(messages[0])
            if mode == "cold":
                engine.close()
                engine = MemoryEngine(settings)
            if mode == "rebuilt":
                view = [dict(m) for m in history]
            elif mode == "fresh system":
                view = [{"role": "system", "content": f"Now: turn {len(timings)}."}, *history]
            else:
                view = history
            started = time.perf_counter()
            engine.prepare(view, session_id="bench")
            timings.append((time.perf_counter() - started) * 1000)
            history.extend(messages[1:])
    finally:
        engine.close()
    return timings


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    turns = simulate_session(400)
    budget = 400_000
    print(f"prepare() per turn, {len(turns)} simulated RAG turns (demo session), B = {budget:,}\n")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("incremental", "fresh system", "rebuilt", "cold"):
            results[mode] = run(mode, turns, budget, Path(tmp) / f"{mode}.db")
    base_late = statistics.median(results["incremental"][-100:])
    modes = {}
    print(
        f"{'mode':<12} {'median ms':>10} {'p95 ms':>8} {'last-100 median':>16} {'× incremental':>14}"
    )
    for mode, timings in results.items():
        late = statistics.median(timings[-100:])
        modes[mode] = {
            "p50_ms": statistics.median(timings),
            "p95_ms": statistics.quantiles(timings, n=20)[18],
            "first_100_p50_ms": statistics.median(timings[:100]),
            "last_100_p50_ms": late,
            "last_100_over_incremental": late / base_late,
        }
        print(
            f"{mode:<12} {modes[mode]['p50_ms']:>10.3f} {modes[mode]['p95_ms']:>8.3f} "
            f"{late:>16.3f} {late / base_late:>14.2f}"
        )
    early = statistics.median(results["incremental"][:100])
    print(
        f"\nincremental: last-100 / first-100 median = {base_late / early:.2f} "
        "(near 1 means cost follows what is new, not the whole history)"
    )
    payload = {
        "benchmark": "run",
        "command": "python -m benchmarks.run",
        "turns": len(turns),
        "context_window_chars": budget,
        "modes": modes,
        "incremental_last_100_over_first_100": base_late / early,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"\nwritten: {RESULTS}")


if __name__ == "__main__":
    main()
