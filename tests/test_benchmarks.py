"""The benchmarks that time recall at scale still run on the engine's public names: a rename
in the package once broke ``make bench`` while every test passed (nothing here ran them)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import scale


def test_the_scale_benchmark_runs_at_its_smallest_size(tmp_path: Path) -> None:
    """``benchmarks.scale``'s growing part at 1,000 messages: fresh questions recalled, the
    bounded top-k the same as the exhaustive one (its default reads every block it needs)."""
    (row,) = scale.growing((1_000,), tmp_path)
    assert row["indexed"] == 1_000
    assert row["answered_share"] > 0.5
    assert (row["exact_share"], row["recall_at_k"]) == (1.0, 1.0)


def test_the_long_session_part_runs(tmp_path: Path) -> None:
    """``benchmarks.scale``'s long-session part over 210 turns: every window timed."""
    row = scale.long_session(210, seed=3, budget=20_000, tmp=tmp_path)
    assert row["turns"] == 210
    assert row["early_p50_ms"] > 0 and row["late_p50_ms"] > 0
