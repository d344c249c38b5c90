"""``benchmarks/real_model.py`` (the hand-run check against a real model), run as a real
subprocess against the scripted server, briefly, so it cannot rot."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from fake_openai import DEFAULT_TEXT, FakeOpenAI, fake_openai  # noqa: F401
from sessions import ROOT

from ragent_memory.summary.prompt import SECTIONS


def test_the_real_model_check_runs_against_a_scripted_server(
    fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    """A 24-turn run (its first compaction comes at turn 16): every compaction printed with its outcome, calls, seconds, chars and
    identifiers; the totals line; the JSON under the budget, next to what was there."""
    body = "\n".join(f"{title}\n- ORD-70114 refund due €1,240" for title in SECTIONS["en"])
    fake_openai.default = lambda _body: body
    out = tmp_path / "real_model.json"
    out.write_text(json.dumps({"20000": {"kept": True}}))
    flags = ["--model", "m", "--budget", "12000", "--turns", "24", "--timeout-s", "10"]
    flags += ["--compaction-timeout-s", "60", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.real_model", "--url", fake_openai.base_url, *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    lines = done.stdout.splitlines()
    generations = [line for line in lines if line.startswith("gen ")]
    assert generations and all("applied" in g and "calls 1" in g for g in generations)
    assert "ids in summary" in generations[-1] and "accepted" in generations[-1]
    assert lines[-1].startswith("TOTAL B=12,000:")
    assert "turn-1 constraint verbatim: yes" in lines[-1]

    saved = json.loads(out.read_text())
    assert {"kept": True} == saved["20000"]
    result = saved["12000"]
    totals = result["totals"]
    assert (len(generations), len(generations)) == (
        totals["compactions"],
        totals["model_written"],
    )
    assert (100.0, 0, len(generations)) == (
        totals["model_written_pct"],
        totals["rejected_for_length"],
        totals["calls"],
    )
    first = result["compactions"][0]
    assert ("model", 1) == (first["written_by"], first["calls"])
    assert first["identifiers"]["total"] > 0
    assert first["identifiers"]["kept"] >= first["identifiers"]["in_summary"]
    assert len(fake_openai.requests) == totals["calls"]


_PREVIOUS = re.compile(r'<previous_summary nonce="\w+">\n(.*?)\n</previous_summary', re.S)


def _echo_previous(body: Any) -> str:
    """A model that answers with the previous summary byte for byte (empty sections first)."""
    found = _PREVIOUS.search(body["messages"][-1]["content"])
    previous = found.group(1) if found else "none"
    return DEFAULT_TEXT if previous == "none" else previous


def test_the_orders_workload_moves_every_generation_on_with_a_model_that_repeats_itself(
    fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    """``--workload orders`` against a model that always echoes the previous summary: every
    compaction applied, each later one after one retry, every generation holding new order
    ids; the totals count the repeats and no failure for them."""
    fake_openai.default = _echo_previous
    out = tmp_path / "real_model.json"
    flags = ["--model", "m", "--budget", "12000", "--turns", "120", "--timeout-s", "10"]
    flags += ["--compaction-timeout-s", "60", "--workload", "orders", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.real_model", "--url", fake_openai.base_url, *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    result = json.loads(out.read_text())["12000-orders"]
    records, totals = result["compactions"], result["totals"]
    assert len(records) >= 4, done.stdout
    assert ["applied"] * len(records) == [r["status"] for r in records], done.stdout
    assert all(r["repeated"] and r["calls"] == 2 for r in records[1:]), done.stdout
    assert all(0 < r["new_ids"]["in_summary"] for r in records), done.stdout
    assert (len(records), 0) == (totals["moved_on"], totals["failed_for_repeat"])
    assert totals["repeats"] == len(records) - 1
    assert "generations that moved on" in done.stdout.splitlines()[-1]
