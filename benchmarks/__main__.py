"""``make bench``: every benchmark in turn, each in its own process, then how long each took.

    python -m benchmarks [--only versus] [--only pg]

Wall time is what ``make bench`` costs; CPU time (user + system, the part's threads and
children included) is what it would cost on an idle machine, where a shared one inflates wall
time. A part that fails is reported and the others still run; the exit status says whether
all passed.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

PARTS = ("run", "versus", "locomo", "proxy", "pg")


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=PARTS, help="run only these parts")
    args = parser.parse_args()
    timings: list[tuple[str, float, float, int]] = []
    for part in args.only or PARTS:
        print(f"\n===== benchmarks.{part}", flush=True)
        wall, cpu = time.perf_counter(), cpu_s()
        code = subprocess.call([sys.executable, "-m", f"benchmarks.{part}"])
        timings.append((part, time.perf_counter() - wall, cpu_s() - cpu, code))
    print(f"\n{'part':<10} {'wall s':>8} {'CPU s':>8}  status")
    for part, wall_s, cpu, code in timings:
        print(f"{part:<10} {wall_s:>8.1f} {cpu:>8.1f}  {'ok' if code == 0 else f'exit {code}'}")
    total_wall = sum(t[1] for t in timings)
    print(f"{'total':<10} {total_wall:>8.1f} {sum(t[2] for t in timings):>8.1f}")
    sys.exit(max((t[3] != 0 for t in timings), default=False))


if __name__ == "__main__":
    main()
