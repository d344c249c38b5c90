"""``ragent-memory demo``: a long simulated RAG-agent session, offline, through every gate.
The agent answers from a bundled knowledge base with ``search_knowledge``, sometimes pulls an
oversized export, and once reads a ref back with the recall tool. Seeded; no network, no key."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
import click

from ragent_memory.core.chars import Message, clip, text_of
from ragent_memory.engine.memory_engine import MemoryEngine, TurnReport
from ragent_memory.recall.refs import FOOTER_MARK, RECALL_TOOL_NAME, find_refs
from ragent_memory.settings import Settings, StoreSettings, load_settings

KNOWLEDGE = MappingProxyType(
    {
        "refund policy": "Refunds are issued within 14 days of purchase to the original payment method.",
        "shipping times": "Standard shipping takes 3–5 business days; express ships next day.",
        "warranty terms": "Hardware carries a 24-month warranty; batteries are covered for 12 months.",
        "invoice format": "Invoices are PDF files numbered INV-YYYY-NNNNN and list VAT separately.",
        "api limits": "The public API allows 600 requests per minute per key, burst 100.",
        "data retention": "Logs are kept 30 days; backups 90 days; audit trails 7 years.",
        "sso setup": "SSO supports SAML 2.0 and OIDC; the ACS URL ends in /sso/acs.",
        "pricing tiers": "Starter is 9 EUR/month, Team 29 EUR/user, Enterprise is quoted.",
        "on-call rota": "The on-call rota rotates weekly on Mondays at 09:00 CET.",
        "backup schedule": "Backups run nightly at 02:00 UTC and are verified every Sunday.",
    }
)
QUESTIONS = (
    "What does our {t} say?",
    "Can you double-check the {t} for the customer in ticket T-{n}?",
    "Summarise the {t} in two lines, please.",
    "Is anything in the {t} relevant to order #{n}?",
)
CONSTRAINTS = (
    "Never exceed 4,321 euros in total for this account.",
    "Don't send anything to the customer until I say so.",
    "Reply in English only, and keep answers under 80 words.",
)
# Durable facts the user mentions along the way; long-term memory should learn them.
FACTS = (
    "My name is Dana Reyes.",
    "I work at Northwind Support.",
    "I prefer short bullet-point answers.",
)


def _search_result(topic: str, rng: random.Random) -> str:
    return "\n".join(
        f"[{topic} · doc {k}] {KNOWLEDGE[topic]} (revision {rng.randint(1, 40)})"
        for k in range(rng.randint(10, 40))
    )


def _tool_turn(call_id: str, name: str, arguments: dict[str, Any], result: str) -> list[Message]:
    """An assistant's one tool call and its result."""
    function = {"name": name, "arguments": json.dumps(arguments)}
    call = {"id": call_id, "type": "function", "function": function}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


def simulate_session(turns: int, *, seed: int = 42) -> list[list[Message]]:
    """The session as a list of turns, each a list of messages (user first)."""
    rng = random.Random(seed)
    topics = list(KNOWLEDGE)
    out: list[list[Message]] = []
    for turn in range(turns):
        topic = topics[turn % len(topics)]
        question = QUESTIONS[turn % len(QUESTIONS)].format(t=topic, n=1000 + turn)
        if turn < len(CONSTRAINTS):
            question = f"{CONSTRAINTS[turn]} {question}"
        elif turn - len(CONSTRAINTS) < len(FACTS):
            question = f"{FACTS[turn - len(CONSTRAINTS)]} {question}"
        search = {"query": topic, "top_k": 8}
        messages = [
            {"role": "user", "content": question},
            *_tool_turn(f"call_{turn}", "search_knowledge", search, _search_result(topic, rng)),
        ]
        if turn % 37 == 36:  # an oversized export, truncated by the reduction step
            rows = "\n".join(
                f"row {i}: {topic} record {rng.randint(10_000, 99_999)}" for i in range(4_000)
            )
            messages += _tool_turn(f"export_{turn}", "export_records", {"topic": topic}, rows)
        answer = f"Per the knowledge base: {KNOWLEDGE[topic]} Done for turn {turn}."
        out.append([*messages, {"role": "assistant", "content": answer}])
    return out


READ_BACK_PAGE_CHARS = 300


@attrs.frozen
class ReadBackLoop:
    """The one recall round trip of the demo, as the model saw it."""

    turn: int
    seen: str  # the placeholder or notice line naming the ref
    call: dict[str, Any]  # the assistant message calling the recall tool
    answer: dict[str, Any]  # the tool message answering it, from engine.recall


def _read_back_loop(
    engine: MemoryEngine, view: list[dict[str, Any]], session_id: str, turn: int
) -> ReadBackLoop | None:
    """If the prepared view shows a recall ref, call the recall tool on it as a model would."""
    for message in view:
        if message.get("role") != "tool":
            continue
        text = text_of(message)
        refs = find_refs(text)
        if not refs:
            continue
        seen = next(line for line in text.splitlines() if refs[0] in line)
        # A preview's notice says where the omitted part starts; a placeholder reads from 0.
        start = re.search(r"offset=(\d+)", seen)
        offset = int(start.group(1)) if start else 0
        arguments: dict[str, Any] = {
            "ref": refs[0],
            "offset": offset,
            "limit": READ_BACK_PAGE_CHARS,
        }
        call, answer = _tool_turn(
            f"recall_{turn}", RECALL_TOOL_NAME, arguments, engine.recall(session_id, **arguments)
        )
        return ReadBackLoop(turn, seen, call, answer)
    return None


def run_demo(
    *,
    config: str | None,
    turns: int,
    out_dir: Path,
    db_path: Path | None = None,
    chart_path: Path | None = None,
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    db_path = db_path or out_dir / "demo.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db_path}{suffix}").unlink(missing_ok=True)
    settings = load_settings(config) if config else Settings(context_window_chars=60_000)
    settings = attrs.evolve(settings, store=StoreSettings(path=str(db_path)))
    session = simulate_session(turns)
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a support agent. Use search_knowledge to answer."}
    ]
    reports: list[TurnReport] = []
    recalled: ReadBackLoop | None = None
    with MemoryEngine(settings) as engine:
        with click.progressbar(session, label="agent turns", show_pos=True) as bar:
            for turn, messages in enumerate(bar):
                history.append(messages[0])
                prepared = engine.prepare(history, session_id="demo", user_id="demo-user")
                reports.append(prepared.report)
                if recalled is None:
                    recalled = _read_back_loop(engine, prepared.messages, "demo", turn)
                    if recalled is not None:  # the model's call and its answer join the history
                        history += [recalled.call, recalled.answer]
                history.extend(messages[1:])
                engine.after_turn(history, session_id="demo", user_id="demo-user")
        engine.flush()
        audit_rows = engine.store.compactions("demo")
        facts = [f.content for f in engine.memories("demo-user")]
        # A new session of the same user starts with what was learned.
        fresh = engine.prepare(
            [history[0], {"role": "user", "content": "Hi again, what's new on refunds?"}],
            session_id="demo-2",
            user_id="demo-user",
        )
    _print_summary(settings, reports, audit_rows, db_path, recalled)
    _print_memory(facts, fresh.report.memory_chars)
    _chart(reports, settings, chart_path or out_dir / "context.png")
    # The last line: the command that opens this session in the audit page.
    click.echo(f"\n  see what each compaction kept: ragent-memory ui --db {db_path} --session demo")


def _print_summary(
    settings: Settings,
    reports: list[TurnReport],
    audit_rows: list[dict[str, Any]],
    db_path: Path,
    recalled: ReadBackLoop | None,
) -> None:
    applied = [r for r in audit_rows if r["status"] == "applied"]
    last = reports[-1]
    peak = max(r.chars_out for r in reports)
    generations = f"{len(applied)} generation{'' if len(applied) == 1 else 's'} applied"
    placeholders = f"{last.trimmed} results shown as placeholders at the end"
    previews = f"{max(r.truncated for r in reports)} oversized results shown as previews"
    mean_ms = sum(r.duration_ms for r in reports) / len(reports)
    rows = [
        ("budget B", f"{settings.context_window_chars:,}", ""),
        ("history at the end", f"{last.chars_raw:,}", f"{len(reports)} turns"),
        ("largest context sent", f"{peak:,}", f"{peak / settings.context_window_chars:.0%} of B"),
        ("trim gate (50%)", f"{settings.trim_trigger_chars:,}", placeholders),
        ("reduction", f"{settings.oversized_tool_result_chars:,}", previews),
        ("compaction gate (80%)", f"{settings.compact_trigger_chars:,}", generations),
        ("final context", f"{last.chars_out:,}", f"generation {last.generation}"),
        ("prepare time", f"{mean_ms:.2f} ms", "mean per turn"),
    ]
    width = max(len(r[0]) for r in rows)
    click.echo("\nragent-memory demo (offline summarizer, no network)\n")
    for name, value, note in rows:
        click.echo(f"  {name:<{width}}  {value:>12}  {note}")
    if recalled is not None:
        _print_read_back(recalled)
    click.echo(f"\n  audit log: {db_path}  (ragent-memory audit --db {db_path})")


def _print_memory(facts: list[str], block_chars: int) -> None:
    if not facts:
        return
    click.echo(f"\n  long-term memory: {len(facts)} facts learned about demo-user")
    for fact in facts:
        click.echo(f"    - {_line(fact)}")
    click.echo(f"  a new session of that user starts with a {block_chars:,}-char memory block")


def _line(text: str, max_chars: int = 110) -> str:
    """``text`` on one clipped terminal line."""
    return clip(text.replace("\n", " ⏎ "), max_chars)


def _print_read_back(loop: ReadBackLoop) -> None:
    function = loop.call["tool_calls"][0]["function"]
    piece, _, footer = loop.answer["content"].partition(FOOTER_MARK)
    click.echo(f"\n  recall loop (turn {loop.turn}):")
    click.echo(f"    the model sees   {_line(loop.seen.strip(), 160)}")
    click.echo(f"    it calls         {function['name']}({function['arguments']})")
    click.echo(f"    engine.recall →  {_line(piece)}")
    if footer:
        click.echo(f"                     {_line('[recall: ' + footer)}")


def _chart(reports: list[TurnReport], settings: Settings, path: Path) -> None:
    """Context size per turn: raw history, what was sent, the gates, B and each compaction."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        click.echo("  (pip install 'ragent-memory[chart]' for a chart of context size per turn)")
        return
    budget = settings.context_window_chars
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot([r.chars_raw for r in reports], label="raw history", color="#9e9e9e")
    ax.plot([r.chars_out for r in reports], label="context sent", color="#1f77b4", linewidth=1.6)
    lines = ((1.0, "budget B", "#d62728", "-"), (0.8, "compact 80%", "#ff7f0e", "--"),
             (0.5, "trim 50%", "#2ca02c", "--"))  # fmt: skip
    for frac, name, colour, style in lines:
        ax.axhline(frac * budget, color=colour, linestyle=style, linewidth=1, label=name)
    turns = [n for n, r in enumerate(reports) if r.compacted]
    ax.scatter(turns, [reports[n].chars_out for n in turns], marker="v", color="#9467bd",
               zorder=3, label=f"compaction ({len(turns)})")  # fmt: skip
    title = f"ragent_memory demo: context per turn, B = {budget:,} chars"
    ax.set(yscale="log", title=title, xlabel="turn", ylabel="chars")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    click.echo(f"  chart: {path}")
