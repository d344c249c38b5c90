"""An experiment, not part of ``make bench``: would a top-k that reads a bounded number of
postings beat the exact one (``recall/topk.py``) on the scale benchmark's history?

The bounded arm is the threshold algorithm (Fagin, Lotem & Naor, "Optimal aggregation
algorithms for middleware", PODS 2001) over impact-ordered postings (Anh & Moffat, "Pruned
query evaluation using pre-computed impacts", SIGIR 2006): each long term's postings grouped
by count (1, 2-3, 4-7, ...) and, within a group, by row length, so a group's BM25 falls along
it whatever the mean length; the query reads each term's best postings in rounds (128, then
doubling), scores every new row exactly, and stops when the k-th best beats what any unread
row could score (exact) or when each term has had ``budget`` postings read (approximate).
MaxScore leaves unread the weakest terms that cannot lift a row to the k-th best alone.
The groups are built before timing starts, as an index would keep them.

    python -m benchmarks.topk_budget [--size 100000] [--questions 300]

Prints, per budget, recall@40 against the exact top-k, the share of questions the bound
stopped exactly, and both arms' p50 CPU ms; writes ``benchmarks/results/topk_budget.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from benchmarks import scale
from ragent_memory import MemoryEngine, Settings, StoreSettings
from ragent_memory.recall.excerpts import CANDIDATES
from ragent_memory.recall.rank import IDF_FLOOR, _Unit, query_keys
from ragent_memory.recall.topk import (
    COUNT_BITS,
    COUNT_MAX,
    K1,
    LONG,
    B,
    Norm,
    Term,
    _Best,
    _score,
    _sorted_unique,
    _without,
)
from ragent_memory.text.terms import search_terms

RESULTS = Path(__file__).resolve().parent / "results" / "topk_budget.json"
BUDGETS = (512, 1_024, 2_048, 4_096)
FIRST = 128  # postings per term in the first round
_ROW = (1 << 31) - 1
Group = tuple[np.ndarray, int]  # keys (length << 32 | ~row), ascending; the group's largest count


def groups(postings: np.ndarray, lengths: np.ndarray) -> list[Group]:
    """A long term's postings by count group (log2 of the count), each by length then newest."""
    rows, counts = postings >> COUNT_BITS, postings & COUNT_MAX
    kind = np.floor(np.log2(counts)).astype(np.int64)
    keys = (lengths[rows].astype(np.int64) << 32) | (_ROW - rows)
    return [(np.sort(keys[kind == k]), int(counts[kind == k].max())) for k in np.unique(kind)]


class Query:
    """One question's terms over a unit: weights, the exact scoring and the groups read."""

    def __init__(self, unit: _Unit, keys: Sequence[str], held: dict[str, list[Group]]) -> None:
        n = len(unit.ids)
        self.terms: list[Term] = []
        self.groups: list[list[Group] | None] = []
        for key, times in Counter(keys).items():
            posting = unit.postings.get(key)
            if posting is None:
                continue
            many = not isinstance(posting, int)
            count = len(posting) if many else 1  # type: ignore[arg-type]
            idf = math.log((n - count + 0.5) / (count + 0.5))
            weight = times * (idf if idf > 0 else IDF_FLOOR) * (K1 + 1.0)
            postings = (
                np.frombuffer(posting, dtype=np.int64) if many else np.array([posting], np.int64)
            )
            dense = unit.dense.get(key)
            counts = None if dense is None else np.frombuffer(dense, dtype=np.uint8)
            self.terms.append(Term(weight, postings, None, counts))
            self.groups.append(held.get(key) if count > LONG else None)
        lengths = np.frombuffer(unit.lengths, dtype=np.float64)
        self.norm = Norm(lengths, K1 * B * n / unit.total, K1 * (1.0 - B))

    def impact(self, weight: float, count: int, lengths: np.ndarray) -> np.ndarray:
        return weight * count / (count + lengths * self.norm.scale + self.norm.base)


def bounded_top_k(query: Query, limit: int, budget: int) -> tuple[list[int], bool]:
    """The top ``limit`` rows and whether the bound stopped the reading (exact)."""
    best, terms, norm = _Best(limit), query.terms, query.norm
    short = [t.postings >> COUNT_BITS for t, g in zip(terms, query.groups, strict=True) if not g]
    seen = _sorted_unique(np.concatenate(short)) if short else np.zeros(0, np.int64)
    best.merge(seen, _score(terms, seen, norm))
    long = [(t, g) for t, g in zip(terms, query.groups, strict=True) if g]
    at = [[0] * len(g) for _, g in long]
    tops = [
        max(query.impact(t.weight, c, (k[:1] >> 32).astype(float))[0] for k, c in g)
        for t, g in long
    ]
    step, read = FIRST, 0
    while long:
        fronts = []
        for j, (term, held) in enumerate(long):
            heads = [
                query.impact(term.weight, c, np.array([float(k[i] >> 32)]))[0]
                for (k, c), i in zip(held, at[j], strict=True)
                if i < len(k)
            ]
            fronts.append(max(heads, default=0.0))
        threshold = best.threshold()
        weakest, skipped, total = sorted(range(len(long)), key=lambda j: tops[j]), set(), 0.0
        for j in weakest if threshold is not None else ():
            total += tops[j]
            if total * (1 + 1e-9) >= threshold:
                break
            skipped.add(j)
        bound = sum(tops[j] if j in skipped else fronts[j] for j in range(len(long)))
        if (threshold is not None and bound * (1 + 1e-9) < threshold) or not any(fronts):
            return best.rows.tolist(), True
        if read >= budget:
            return best.rows.tolist(), False
        pieces = []
        for j, (term, held) in enumerate(long):
            if j in skipped or not fronts[j]:
                continue
            nexts = [
                query.impact(term.weight, c, (k[i : i + step] >> 32).astype(float))
                for (k, c), i in zip(held, at[j], strict=True)
            ]
            every = np.concatenate(nexts)
            cut = (
                np.partition(every, len(every) - step)[len(every) - step]
                if len(every) > step
                else -1
            )
            for g, ((keys, _), part) in enumerate(zip(held, nexts, strict=True)):
                take = int((part >= cut).sum())
                pieces.append(_ROW - (keys[at[j][g] : at[j][g] + take] & 0xFFFFFFFF))
                at[j][g] += take
        found = _without(_sorted_unique(np.concatenate(pieces)), seen)
        seen = _sorted_unique(np.concatenate((seen, found)))
        best.merge(found, _score(terms, found, norm))
        read, step = read + step, step * 2
    return best.rows.tolist(), True


def measure(unit: _Unit, stem: Any, questions: Sequence[str]) -> dict[str, Any]:
    lengths = np.frombuffer(unit.lengths, dtype=np.float64)
    held = {
        key: groups(np.frombuffer(p, dtype=np.int64), lengths)
        for key, p in unit.postings.items()
        if not isinstance(p, int) and len(p) > LONG
    }
    ask = {"session_id": "-", "visible_from": 0, "shown": (), "limit": CANDIDATES}
    exact, bounded = [], {budget: ([], [], []) for budget in BUDGETS}
    for question in questions:
        keys = query_keys(search_terms(question), stem)
        started = time.process_time()
        truth = [row for row, _ in unit.rank(keys, **ask)]
        exact.append((time.process_time() - started) * 1000)
        query = Query(unit, keys, held)
        for budget, (times, recalls, stopped) in bounded.items():
            started = time.process_time()
            rows, settled = bounded_top_k(query, CANDIDATES, budget)
            times.append((time.process_time() - started) * 1000)
            recalls.append(len(set(rows) & set(truth)) / max(len(truth), 1))
            stopped.append(settled)
    return {
        "rows": len(unit.ids),
        "questions": len(questions),
        "exact_p50_ms": statistics.median(exact),
        "bounded": [
            {
                "budget": budget,
                "recall_at_k": statistics.mean(recalls),
                "worst_recall": min(recalls),
                "exact_stops": sum(stopped) / len(stopped),
                "p50_ms": statistics.median(times),
            }
            for budget, (times, recalls, stopped) in bounded.items()
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000, help="indexed messages")
    parser.add_argument("--questions", type=int, default=300)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    chat = scale.Chat()
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            context_window_chars=scale.BUDGET,
            store=StoreSettings(path=str(Path(tmp) / "grow.db")),
            long_term_enabled=False,
        )
        with MemoryEngine(settings) as engine:
            scale.grow(engine, chat, range(args.size // (2 * scale.SESSION_TURNS)))
            engine.search("warm", chat.question(), user_id="u")  # the unit read in
            mirror = engine.recaller.mirror  # type: ignore[union-attr]
            unit = mirror._units[("u", "u")]
            result = measure(unit, mirror.stem, [chat.question() for _ in range(args.questions)])
    print(f"{result['rows']:,} messages, exact top-k p50 {result['exact_p50_ms']:.3f} ms")
    print(f"{'budget':>7} {'recall@40':>9} {'worst':>6} {'exact stops':>11} {'p50 ms':>7}")
    for row in result["bounded"]:
        print(
            f"{row['budget']:>7,} {row['recall_at_k']:>9.4f} {row['worst_recall']:>6.3f} "
            f"{row['exact_stops']:>11.2f} {row['p50_ms']:>7.3f}"
        )
    payload = {"benchmark": "topk_budget", "command": "python -m benchmarks.topk_budget", **result}
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
