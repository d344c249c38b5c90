"""``make bench``: every benchmark in turn, each in its own process, then how long each took.

    python -m benchmarks [--only versus] [--only pg] [--only facts]

Wall time is what ``make bench`` costs; CPU time (user + system, the part's threads and
children included) is what it would cost on an idle machine, where a shared one inflates wall
time. A part that fails is reported and the others still run; the exit status says whether
all passed. Each part writes ``benchmarks/results/PART.json``; this runner adds a ``recorded``
entry to it (commit, time, load, wall and CPU time) and then writes ``docs/benchmarks.md``
from every results file (``python -m benchmarks.report``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks import report

PARTS = (
    "run",
    "scale",
    "versus",
    "locomo",
    "beam",
    "beam_misses",
    "turn_cap",
    "proxy",
    "pg",
    "facts",
)
RESULTS = Path(__file__).resolve().parent / "results"


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def stamp(part: str, started: datetime, wall_s: float, cpu: float, load: float) -> None:
    """Say in the part's results file when, on what and at what cost it was measured."""
    path = RESULTS / f"{part}.json"
    if not path.exists() or path.stat().st_mtime < started.timestamp():
        return  # the part wrote nothing this time (it failed, or a partial run)
    data = json.loads(path.read_text(encoding="utf-8"))
    data["recorded"] = {
        "commit": report.commit(),
        "started_utc": started.strftime("%Y-%m-%d %H:%M"),
        "wall_s": round(wall_s, 1),
        "cpu_s": round(cpu, 1),
        "load_average": [round(load, 2), round(os.getloadavg()[0], 2)],
        "cores": os.cpu_count(),
    }
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=PARTS, help="run only these parts")
    args = parser.parse_args()
    timings: list[tuple[str, float, float, int]] = []
    for part in args.only or PARTS:
        print(f"\n===== benchmarks.{part}", flush=True)
        started, load = datetime.now(UTC), os.getloadavg()[0]
        wall, cpu = time.perf_counter(), cpu_s()
        code = subprocess.call([sys.executable, "-m", f"benchmarks.{part}"])
        timings.append((part, time.perf_counter() - wall, cpu_s() - cpu, code))
        if code == 0:
            stamp(part, started, timings[-1][1], timings[-1][2], load)
    print(f"\n{'part':<10} {'wall s':>8} {'CPU s':>8}  status")
    for part, wall_s, cpu, code in timings:
        print(f"{part:<10} {wall_s:>8.1f} {cpu:>8.1f}  {'ok' if code == 0 else f'exit {code}'}")
    total_wall = sum(t[1] for t in timings)
    print(f"{'total':<10} {total_wall:>8.1f} {sum(t[2] for t in timings):>8.1f}")
    print(f"written: {report.write()}")
    sys.exit(max((t[3] != 0 for t in timings), default=False))


if __name__ == "__main__":
    main()
