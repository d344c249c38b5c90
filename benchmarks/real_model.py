"""A real-model check you run by hand (not in ``make bench``: it needs a model's URL).

    python -m benchmarks.real_model --url http://127.0.0.1:8079/v1 --model local --budget 12000
    make real-model URL=http://127.0.0.1:8079/v1 B=12000

Points the engine at an OpenAI-compatible server and drives a RAG session (a search tool's
results, facts with identifiers planted in the first turns, a constraint in turn 1) with
``offline_fallback: false``, so every summary is the model's own or a failure. Each turn waits
for its compaction (as an agent whose own model call takes as long would). Printed per
compaction: accepted or why not, model calls, seconds, summary chars, planted identifiers kept
in the summary and found by recall (``engine.search`` with a question naming the fact's
subject, not the identifier). Then one line of totals: the share the model wrote, rejections
for length, identifiers kept after 5 generations, the turn-1 constraint verbatim or not.
Results are added to ``benchmarks/results/real_model.json`` under the budget. Bounded: every
request times out (``--timeout-s``), every turn waits at most ``--compaction-timeout-s``.

``--workload orders``: the refunds agent looks up a batch of orders every turn, each result
planting four new order ids, the workload on which a small model repeated its previous summary
(results under ``<budget>-orders``). Printed per compaction besides: how many of the order ids
new in its material (not in the previous summary) the summary holds, and whether the model's
reply repeated the previous summary; the totals count the generations that moved on and the
compactions that failed for a repeat (there should be none).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs

from benchmarks.report import commit
from ragent_memory import LLMSettings, Settings, StoreSettings
from ragent_memory.core.identifiers import kept_in
from ragent_memory.core.logs import EVENT_ATTR, ROOT
from ragent_memory.engine.memory_engine import MemoryEngine

RESULTS = Path(__file__).resolve().parent / "results" / "real_model.json"
SESSION, USER = "real-model", "bench-user"
CONSTRAINT = (
    "Audit the March orders for me. Never approve a refund over 4,321 euros without my "
    "written OK, and do not email any customer yet."
)
# (subject, order code, amount, customer): one planted fact per early turn, each subject unique
# so a question can name it without naming the identifiers.
FACTS = (
    ("standing desk", "ORD-70114", "€1,240", "Maria Lopez"),
    ("espresso machine", "ORD-70231", "€389", "Dana Reyes"),
    ("mountain bike", "ORD-70385", "€2,115", "Omar Haddad"),
    ("noise-cancelling headphones", "ORD-70402", "€279", "Lena Fox"),
    ("ergonomic chair", "ORD-70577", "€645", "Ivo Petrov"),
    ("air purifier", "ORD-70619", "€412", "Sara Kim"),
    ("gaming monitor", "ORD-70733", "€899", "Tomas Berg"),
    ("robot vacuum", "ORD-70856", "€530", "Nadia Aziz"),
    ("electric kettle", "ORD-70948", "€64", "Paolo Conti"),
    ("camping tent", "ORD-71027", "€318", "Yuki Tanaka"),
)
FILLER = (
    "Policy note: refunds follow the standard 30-day window; partial refunds need a reason "
    "code; shipping fees are refunded only for damaged goods. "
)
GENERATIONS = 5  # identifiers are counted once this generation applied
WORKLOADS = ("rag", "orders")
ORDERS_PER_TURN = 4
ORDER_ID = re.compile(r"\bORD-\d+\b")
CUSTOMERS = tuple(fact[3] for fact in FACTS)


def planted(turn: int) -> tuple[str, list[str]] | None:
    """Turn ``turn``'s planted fact sentence and its identifiers (None past the facts)."""
    if not 1 <= turn <= len(FACTS):
        return None
    subject, code, amount, name = FACTS[turn - 1]
    sentence = f"The {subject} order {code} for {name} was returned damaged; refund due {amount}."
    return sentence, [code, amount, name]


def turn_messages(turn: int) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Turn ``turn``: the user's message, the tool loop (call + ~1k-char result) and the
    assistant's answer. Turn 0 states the constraint."""
    fact = planted(turn)
    if turn == 0:
        question = CONSTRAINT
    elif fact is not None:
        question = f"Next, check the {FACTS[turn - 1][0]} order and what we owe."
    else:
        question = f"Look up refund rule {turn} in the knowledge base, please."
    call_id = f"call_{turn}"
    query = question[:60]
    call = {"name": "search_knowledge", "arguments": json.dumps({"query": query})}
    result = " ".join(p for p in (FILLER * 4, fact[0] if fact else "", FILLER * 3) if p)
    loop = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]
    answer = {"role": "assistant", "content": "I checked the knowledge base. " * 5}
    return {"role": "user", "content": question}, loop, answer


def order_turn(turn: int) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """The orders workload's turn ``turn``: a lookup of a batch whose result plants four new
    order ids (with an amount and a customer each) between policy text."""
    if turn == 0:
        return turn_messages(0)
    call_id = f"call_{turn}"
    found = [
        f"Order ORD-{80_000 + turn * 10 + k} for {CUSTOMERS[(turn + k) % len(CUSTOMERS)]}: "
        f"returned damaged, refund due €{100 + turn * 7 + k}."
        for k in range(ORDERS_PER_TURN)
    ]
    call = {"name": "lookup_orders", "arguments": json.dumps({"batch": turn})}
    loop = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": call_id, "content": f"{FILLER * 2}{' '.join(found)}"},
    ]
    answer = {"role": "assistant", "content": f"Batch {turn} checked; the refunds are listed."}
    user = {"role": "user", "content": f"Check refund batch {turn}, please."}
    return user, loop, answer


class Attempts(logging.Handler):
    """The library's ``summarizer.attempt`` and ``summary.fitted`` events, as they happen."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.events: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, EVENT_ATTR, None)
        if isinstance(fields, dict) and fields.get("event") in (
            "summarizer.attempt",
            "summary.fitted",
            "summary.repeat_retried",
        ):
            self.events.append(dict(fields))

    def take(self) -> list[dict[str, Any]]:
        taken, self.events = self.events, []
        return taken


@attrs.define
class Run:
    """One session against the model: the engine, the planted facts that left the view."""

    engine: MemoryEngine
    messages: list[dict[str, Any]] = attrs.Factory(list)
    covered: list[int] = attrs.Factory(list)  # planted turns whose tool result left the view
    summary: str = ""  # the last applied generation's summary

    def moved_on(self, row: dict[str, Any]) -> dict[str, int]:
        """Of the order ids in the raw messages ``row`` covered that the previous summary
        lacks: how many there are, how many the new summary holds."""
        covered = self.messages[row["covered_from"] : row["covered_to"]]
        text = "\n".join(str(m.get("content") or "") for m in covered)
        new = [i for i in dict.fromkeys(ORDER_ID.findall(text)) if i not in self.summary]
        summary = row["summary"] or ""
        return {"new": len(new), "in_summary": sum(i in summary for i in new)}

    def kept(self, summary: str) -> dict[str, Any]:
        """Of the covered planted identifiers: how many the summary holds, how many recall
        finds for a question on the fact's subject, how many either."""
        in_summary = by_recall = either = total = 0
        for turn in self.covered:
            fact = planted(turn)
            assert fact is not None
            question = f"What did we find about the {FACTS[turn - 1][0]} order refund?"
            found = self.engine.search(SESSION, question, user_id=USER)
            for identifier in fact[1]:
                total += 1
                summary_has, recall_has = kept_in(identifier, summary), kept_in(identifier, found)
                in_summary += summary_has
                by_recall += recall_has
                either += summary_has or recall_has
        return {"total": total, "in_summary": in_summary, "by_recall": by_recall, "kept": either}

    def note_covered(self, view: Sequence[dict[str, Any]]) -> None:
        shown = "\n".join(str(m.get("content") or "") for m in view)
        for turn in range(1, len(FACTS) + 1):
            fact = planted(turn)
            if (
                fact
                and turn not in self.covered
                and fact[0] in self._raw_text(turn)
                and fact[0] not in shown
            ):
                self.covered.append(turn)

    def _raw_text(self, turn: int) -> str:
        call_id = f"call_{turn}"
        return next(
            (str(m["content"]) for m in self.messages if m.get("tool_call_id") == call_id), ""
        )


def settings_for(args: argparse.Namespace, db: Path) -> Settings:
    llm = LLMSettings(
        base_url=args.url,
        model=args.model,
        api_key_env=args.api_key_env,
        timeout_s=args.timeout_s,
        max_retries=args.max_retries,
        offline_fallback=False,
    )
    return Settings(
        context_window_chars=args.budget,
        store=StoreSettings(path=str(db)),
        llm=llm,
        long_term_enabled=False,  # every model call is a summary's
        compaction_timeout_s=args.compaction_timeout_s,
        compaction_workers=1,
    )


def why_not(row: dict[str, Any], attempts: list[dict[str, Any]]) -> str:
    if row["status"] == "applied":
        fitted = [e for e in attempts if e.get("event") == "summary.fitted"]
        if not fitted:
            return "accepted"
        last = fitted[-1]
        cut = (
            "length-cut, complete sections kept" if last["finish_reason"] == "length" else "fitted"
        )
        return f"accepted ({cut}: {last['reply_chars']:,} → {last['chars']:,} chars)"
    return f"{row['reason']}: {row['error']}"


def compaction_record(
    run: Run, row: dict[str, Any], turn: int, attempts: list[dict[str, Any]]
) -> dict[str, Any]:
    tried = [e for e in attempts if e.get("event") == "summarizer.attempt"]
    record = {
        "generation": row["generation"],
        "turn": turn,
        "status": row["status"],
        "written_by": row["written_by"] or None,
        "outcome": why_not(row, attempts),
        "calls": row["attempts"],
        "seconds": round(row["duration_ms"] / 1000, 1),
        "summary_chars": row["summary_chars"],
        "rejections": [str(e.get("detail")) for e in tried if e.get("error")],
        "repeated": any(e.get("event") == "summary.repeat_retried" for e in attempts),
    }
    if row["status"] == "applied":
        record["new_ids"] = run.moved_on(row)
        run.summary = row["summary"] or ""
        run.engine.flush(60)
        record["identifiers"] = run.kept(row["summary"] or "")
        record["constraint_verbatim"] = f"> {CONSTRAINT}" in (row["summary"] or "")
    return record


def line(record: dict[str, Any]) -> str:
    text = (
        f"gen {record['generation']:>2}  turn {record['turn']:>3}  {record['status']:<7} "
        f"calls {record['calls']}  {record['seconds']:>6.1f} s  summary "
        f"{record['summary_chars']:>5,} chars"
    )
    ids = record.get("identifiers")
    if ids and ids["total"]:
        text += (
            f"  ids in summary {ids['in_summary']}/{ids['total']}, by recall "
            f"{ids['by_recall']}/{ids['total']}, either {ids['kept']}/{ids['total']}"
        )
    new = record.get("new_ids")
    if new and new["new"]:
        text += f"  new order ids in summary {new['in_summary']}/{new['new']}"
    if record["repeated"]:
        text += "  (the reply repeated the previous summary)"
    return f"{text}  — {record['outcome']}"


def drive(args: argparse.Namespace, db: Path) -> list[dict[str, Any]]:
    """The session, turn by turn; one record per audit row (compaction attempt)."""
    handler = Attempts()
    logger = logging.getLogger(ROOT)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    records: list[dict[str, Any]] = []
    engine = MemoryEngine(settings_for(args, db))
    run = Run(engine, [{"role": "system", "content": "You are a refunds agent for a shop."}])
    make_turn = order_turn if args.workload == "orders" else turn_messages
    try:
        for turn in range(args.turns):
            user, loop, answer = make_turn(turn)
            run.messages.append(user)
            for step in (loop, [answer]):
                prepared = engine.prepare(run.messages, session_id=SESSION, user_id=USER)
                run.note_covered(prepared.messages)
                rows = engine.store.compactions(SESSION)
                for row in rows[len(records) :]:
                    records.append(compaction_record(run, row, turn, handler.take()))
                    print(line(records[-1]), flush=True)
                run.messages.extend(step)
    finally:
        engine.close()
        logger.removeHandler(handler)
        logger.setLevel(level)
    return records


def totals(records: list[dict[str, Any]]) -> dict[str, Any]:
    applied = [r for r in records if r["status"] == "applied"]
    by_model = [r for r in applied if r["written_by"] == "model"]
    length = [x for r in records for x in r["rejections"] if "'length'" in x]
    fifth = next((r for r in applied if r["generation"] >= GENERATIONS), None)
    moved = [r for r in applied if r["new_ids"]["in_summary"] or not r["new_ids"]["new"]]
    at = fifth or (applied[-1] if applied else None)
    ids = at.get("identifiers") if at else None
    return {
        "compactions": len(records),
        "applied": len(applied),
        "model_written": len(by_model),
        "model_written_pct": round(100 * len(by_model) / len(records), 1) if records else None,
        "calls": sum(r["calls"] for r in records),
        "seconds": round(sum(r["seconds"] for r in records), 1),
        "rejected_for_length": len(length),
        "ids_generation": at["generation"] if at else None,
        "ids_kept_pct": round(100 * ids["kept"] / ids["total"], 1)
        if ids and ids["total"]
        else None,
        "ids_in_summary_pct": round(100 * ids["in_summary"] / ids["total"], 1)
        if ids and ids["total"]
        else None,
        "constraint_verbatim": bool(applied) and all(r["constraint_verbatim"] for r in applied),
        "moved_on": len(moved),
        "repeats": sum(r["repeated"] for r in records),
        "failed_for_repeat": sum("repeats the previous" in str(r["outcome"]) for r in records),
    }


def total_line(budget: int, total: dict[str, Any]) -> str:
    generation = total["ids_generation"]
    after = f"after {generation} generations" if generation else "(no generation applied)"
    return (
        f"TOTAL B={budget:,}: {total['compactions']} compactions, {total['model_written']} "
        f"model-written ({total['model_written_pct']}%), {total['calls']} calls, "
        f"{total['seconds']} s; rejected for length: {total['rejected_for_length']}; planted "
        f"ids kept {after}: {total['ids_kept_pct']}% (in the summary "
        f"{total['ids_in_summary_pct']}%); turn-1 constraint verbatim: "
        f"{'yes' if total['constraint_verbatim'] else 'no'}; generations that moved on: "
        f"{total['moved_on']}/{total['applied']} ({total['repeats']} repeated the previous summary, {total['failed_for_repeat']} "
        "failed for it)"
    )


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the OpenAI-compatible base URL (…/v1)")
    parser.add_argument("--model", default="local")
    parser.add_argument("--api-key-env", default=None, help="variable holding the key, if any")
    parser.add_argument("--budget", type=int, default=12_000, help="B, in chars")
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per model request")
    parser.add_argument("--max-retries", type=int, default=1, help="per compaction")
    parser.add_argument(
        "--compaction-timeout-s", type=float, default=1_800.0, help="the most one turn waits"
    )
    parser.add_argument("--workload", choices=WORKLOADS, default="rag")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    started, code = datetime.now(UTC), commit()  # the code this run imports, not the later one
    print(
        f"real model: {args.model} at {args.url}, B = {args.budget:,}, {args.turns} turns, "
        f"started {started:%Y-%m-%d %H:%M} UTC",
        flush=True,
    )
    wall = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ragent-real-model-") as tmp:
        records = drive(args, Path(tmp) / "real-model.db")
    total = totals(records)
    print(total_line(args.budget, total), flush=True)
    result = {
        "workload": args.workload,
        "url": args.url,
        "model": args.model,
        "budget": args.budget,
        "turns": args.turns,
        "max_retries": args.max_retries,
        "timeout_s": args.timeout_s,
        "started_utc": f"{started:%Y-%m-%d %H:%M}",
        "wall_s": round(time.monotonic() - wall, 1),
        "commit": code,
        "compactions": records,
        "totals": total,
    }
    out: Path = args.out
    saved = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {}
    suffix = "" if args.workload == "rag" else f"-{args.workload}"
    saved[f"{args.budget}{suffix}"] = result
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(saved, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
