"""``make bench``: prepare() cost per turn, measured side by side in one run.

Three ways an app can call the engine on a growing RAG session:

- incremental: the app appends to one list and passes the same dicts again (the usual case);
- fresh system: the app builds a new system message every turn (a timestamp, say) and passes
  the same history dicts after it;
- rebuilt: the app rebuilds its dicts every turn (from a DB), so every message is re-hashed;
- cold: a new engine per turn on the same store (a restart before every turn).

Numbers are ratios against the incremental path, measured in the same process, so a noisy
shared machine moves them all together.
"""

from __future__ import annotations

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
    print(
        f"{'mode':<12} {'median ms':>10} {'p95 ms':>8} {'last-100 median':>16} {'× incremental':>14}"
    )
    for mode, timings in results.items():
        late = statistics.median(timings[-100:])
        p95 = statistics.quantiles(timings, n=20)[18]
        print(
            f"{mode:<12} {statistics.median(timings):>10.3f} {p95:>8.3f} {late:>16.3f} "
            f"{late / base_late:>14.2f}"
        )
    early = statistics.median(results["incremental"][:100])
    print(
        f"\nincremental: last-100 / first-100 median = {base_late / early:.2f} "
        "(near 1 means cost follows what is new, not the whole history)"
    )


if __name__ == "__main__":
    main()
