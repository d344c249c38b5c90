"""``make bench``: ``prepare`` on PostgreSQL next to SQLite, same workload, one run.

The demo's simulated RAG session, prepared turn by turn with the offline summarizer, budget
and session identical for every arm:

- one host: one engine keeps the session (the usual case);
- two hosts: two engines on the same store take the session in turns of three, so each turn
  after a hand-over reloads the session from the store (docs/design.md §10, many hosts).

PostgreSQL is a throwaway local server (``tests/pg_server.py``): a network round trip on
loopback, no fsync. Ratios are against SQLite's one-host p50 measured in the same process.
Writes ``benchmarks/results/pg.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ragent_memory import Settings, StoreSettings
from ragent_memory.cli.demo import simulate_session
from ragent_memory.engine.memory_engine import MemoryEngine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from pg_server import PASSWORD, postgres_server  # noqa: E402

TURNS = 300
BUDGET = 40_000
STRIDE = 3  # turns per host before a hand-over (two-host arm)
PASSWORD_ENV = "RAGENT_BENCH_PG_PASSWORD"


def run(store: StoreSettings, hosts: int, turns: list[list[dict[str, Any]]]) -> dict[str, Any]:
    settings = Settings(context_window_chars=BUDGET, compaction_timeout_s=120, store=store)
    engines = [MemoryEngine(settings) for _ in range(hosts)]
    history: list[dict[str, Any]] = []
    timings: list[float] = []
    generation = 0
    try:
        for turn, messages in enumerate(turns):
            history.append(messages[0])
            engine = engines[(turn // STRIDE) % hosts]
            started = time.perf_counter()
            report = engine.prepare(history, session_id="bench").report
            timings.append((time.perf_counter() - started) * 1000)
            generation = report.generation
            history.extend(messages[1:])
    finally:
        for engine in engines:
            engine.close()
    # With two hosts, the first turn after each hand-over reloads the session from the store.
    handover = [ms for turn, ms in enumerate(timings) if hosts > 1 and turn and turn % STRIDE == 0]
    steady = [ms for turn, ms in enumerate(timings) if not (hosts > 1 and turn % STRIDE == 0)]
    return {
        "p50_ms": round(statistics.median(timings), 3),
        "p95_ms": round(statistics.quantiles(timings, n=20)[18], 3),
        "steady_p50_ms": round(statistics.median(steady), 3),
        "handover_p50_ms": round(statistics.median(handover), 3) if handover else None,
        "generation": generation,
    }


def main() -> None:
    turns = simulate_session(TURNS)
    os.environ[PASSWORD_ENV] = PASSWORD
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp, postgres_server() as server:
        import psycopg

        for hosts in (1, 2):
            name = f"bench{hosts}"
            with psycopg.connect(f"{server}/postgres", password=PASSWORD, autocommit=True) as c:
                c.execute(f"CREATE DATABASE {name}")
            stores = {
                "sqlite": StoreSettings(path=str(Path(tmp) / f"{name}.db")),
                "postgres": StoreSettings(url=f"{server}/{name}", password_env=PASSWORD_ENV),
            }
            for backend, store in stores.items():
                results[f"{backend}, {hosts} host{'s' if hosts > 1 else ''}"] = run(
                    store, hosts, turns
                )
    base = results["sqlite, 1 host"]["p50_ms"]
    print(f"prepare() per turn, {TURNS} simulated RAG turns, B = {BUDGET:,}, offline summarizer\n")
    print(
        f"{'arm':<18} {'p50 ms':>7} {'p95 ms':>7} {'steady p50':>11} {'hand-over p50':>14}"
        f" {'× sqlite':>9} {'gen':>4}"
    )
    for arm, stats in results.items():
        stats["ratio_p50"] = round(stats["p50_ms"] / base, 2)
        handover = stats["handover_p50_ms"]
        print(
            f"{arm:<18} {stats['p50_ms']:>7.3f} {stats['p95_ms']:>7.3f} "
            f"{stats['steady_p50_ms']:>11.3f} {'-' if handover is None else f'{handover:.3f}':>14}"
            f" {stats['ratio_p50']:>9.2f} {stats['generation']:>4}"
        )
    out = ROOT / "benchmarks" / "results" / "pg.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "pg",
        "turns": TURNS,
        "context_window_chars": BUDGET,
        "handover_every_turns": STRIDE,
        "cores": os.cpu_count(),
        "arms": results,
    }
    out.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    print(f"\n→ {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
