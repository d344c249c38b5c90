"""``make bench``: ragent_memory side by side with LangChain's and deepagents' middleware.

Every arm gets the same seeded workload, the same budget B (in characters: the peers count
with a char counter) and the same summarizer: ragent_memory's offline summarizer, wrapped so
each peer calls it with its own material and so every call's input is measured.

Arms (each optional one is reported as missing when its package is not installed):

- ``langchain full``: ``SummarizationMiddleware`` (trigger 0.8 B, keep 0.2 B) +
  ``ContextEditingMiddleware(ClearToolUsesEdit)`` (trigger 0.5 B, keep 2 results), the pair
  an agent built with ``create_agent`` would use;
- ``langchain summarization``: ``SummarizationMiddleware`` alone;
- ``deepagents``: deepagents' summarization middleware (same trigger and keep, history
  offloaded to a filesystem backend in a temporary directory);
- both peers clip their summarizer input at their default 4,000 tokens (16,000 chars here);
- ``ragent_memory``: ``MemoryEngine.prepare`` on the app's growing list of dicts, and
  ``after_turn`` once the turn's messages are in, as every adapter and the proxy call it (so
  recall searches an index of the whole session, as an app's would); ``after_turn``'s CPU is
  reported on its own (``after_turn_p50_ms``), the peers having no such step;
- ``floor``: copying the list ragent_memory sent (``list``), and copying each of its dicts
  (``dicts``): what any isolating hand-out costs at least.

Measured per turn: CPU time (``time.process_time``: on a loaded machine wall time inflates
short turns), p50/p99, turns 100–200 vs the last 100, ratios to each peer and to the floor;
prefix stability (share of non-compaction turns whose messages start with the previous
turn's, and the mean share of the previous turn's chars that the new one repeats as its
prefix); summarizer chars per compaction ÷ B; summarizer calls per 100k chars of history.
Conversion between dicts and LangChain messages is the app's own cost there and is not timed.

A real tool-calling agent calls the model again after every tool loop, through the engine
each time: the RAG and tool-heavy workloads are run that way too ("every call": ragent_memory
with and without recall, and LangChain's full stack, on the same calls), where the prefix is
measured between consecutive calls and ragent_memory reports how many of its tool-loop calls
still carry the turn's recall block.

Results go to ``benchmarks/results/versus.json``; ``--quick`` runs shorter workloads and, like
``--only`` and ``--no-peers`` (the report's tables need the peers' rows), writes no results file.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import logging
import operator
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ragent_memory import MemoryEngine, Settings, StoreSettings
from ragent_memory.cli.demo import simulate_session
from ragent_memory.core.chars import chars
from ragent_memory.recall.excerpts import HEADERS
from ragent_memory.settings import RECALL_TURN_CHARS, RecallSettings
from ragent_memory.summary.offline import OfflineSummarizer
from ragent_memory.summary.summarize import SummaryOutcome, SummaryRequest

RESULTS = Path(__file__).parent / "results"
# The peers clip what they send their summarizer to 4,000 tokens by default; counted in chars
# here, that is ~16,000 (at ~4 chars per token). Left at 4,000 chars, a single 5,000-char
# search result is "too long to summarize" and they would never call it at all.
PEER_SUMMARY_INPUT_CHARS = 16_000
Turns = list[list[dict[str, Any]]]


# ------------------------------------------------------------------ workloads


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


ZH_TOPICS = ["退货政策", "发货时间", "保修条款", "会员积分", "发票开具", "账户安全", "优惠券"]
ZH_FACTS = [
    "订单号 ORD-{n} 已于周三发出，预计三个工作日内送达。",
    "该商品的保修期为两年，人为损坏不在保修范围内。",
    "会员每消费一百元可获得十个积分，积分有效期为一年。",
    "电子发票会在订单完成后二十四小时内发送到注册邮箱。",
    "退货需在签收后七天内申请，商品须保持原包装完好。",
    "优惠券不可与其他促销活动叠加使用，每单限用一张。",
]


def chinese_session(turns: int, *, seed: int = 7) -> Turns:
    """The RAG workload in Chinese: a question, one search, a long result, an answer."""
    rng = random.Random(seed)
    out: Turns = []
    for turn in range(turns):
        topic = ZH_TOPICS[turn % len(ZH_TOPICS)]
        call_id = f"call_{turn}"
        result = "".join(
            rng.choice(ZH_FACTS).format(n=10_000 + rng.randint(0, 89_999)) for _ in range(60)
        )
        out.append(
            [
                {"role": "user", "content": f"关于{topic}，文档里是怎么说的？（第 {turn} 轮）"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [_call(call_id, "search_knowledge", {"query": topic})],
                },
                {"role": "tool", "tool_call_id": call_id, "content": result},
                {"role": "assistant", "content": f"根据文档，{topic}的要点如下：{result[:200]}"},
            ]
        )
    return out


def tool_heavy_session(turns: int, *, seed: int = 11) -> Turns:
    """Five tool calls per turn (search, read, search, compute, read), one loop each."""
    rng = random.Random(seed)
    tools = ["search_knowledge", "read_file", "search_knowledge", "run_query", "read_file"]
    out: Turns = []
    for turn in range(turns):
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": f"Step {turn}: check the records for batch B-{turn}."}
        ]
        for step, name in enumerate(tools):
            call_id = f"c{turn}_{step}"
            rows = "\n".join(
                f"{name} row {i}: batch B-{turn} value {rng.randint(100, 999_999)}"
                for i in range(rng.randint(10, 40))
            )
            messages += [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [_call(call_id, name, {"batch": turn, "step": step})],
                },
                {"role": "tool", "tool_call_id": call_id, "content": rows},
            ]
        messages.append({"role": "assistant", "content": f"Batch B-{turn} checked."})
        out.append(messages)
    return out


def model_calls(messages: Sequence[dict[str, Any]]) -> list[int]:
    """Where a turn's model calls happen, as how many of its messages precede each: after the
    user's message, and after each tool loop's last result (the agent calls the model again)."""
    stops = [1]
    for index, message in enumerate(messages[1:], 1):
        following = messages[index + 1]["role"] if index + 1 < len(messages) else None
        if message["role"] == "tool" and following != "tool":
            stops.append(index + 1)
    return stops


def language_of(workload: str) -> str:
    """A workload's language, from its name (``rag_2000_zh``: Chinese)."""
    return "zh" if workload.endswith("_zh") else "en"


def workloads(quick: bool) -> Iterator[tuple[str, int, Turns]]:
    scale = 4 if quick else 1
    yield "rag_2000_en", 200_000, simulate_session(2_000 // scale)
    yield "rag_2000_zh", 200_000, chinese_session(2_000 // scale)
    yield "tools_5_per_turn", 200_000, tool_heavy_session(1_000 // scale)
    yield "rag_8000_en", 1_000_000, simulate_session(8_000 // scale, seed=8)


# ------------------------------------------------------------------ the shared summarizer


class Meter:
    """ragent_memory's offline summarizer, counting calls and the chars each call read: the
    rendered transcript of the material it read (``material_chars``, clipped within B when
    ragent_memory bounds it; a peer's material as the peer passed it) plus the previous
    summary."""

    name = "offline-metered"

    def __init__(self, language: str) -> None:
        self.language = language
        self.offline = OfflineSummarizer()
        self.sent: list[int] = []
        self.material: list[int] = []

    def summarize(self, request: SummaryRequest) -> SummaryOutcome:
        outcome = self.offline.summarize(request)
        read = outcome.material_chars
        assert read is not None  # the offline summarizer always says what it read
        self.material.append(read)
        self.sent.append(read + len(request.previous))
        return outcome

    def text(self, messages: Sequence[dict[str, Any]]) -> str:
        """For a peer: its material in, the summary text out."""
        request = SummaryRequest(tuple(messages), "", self.language, 6_000)
        return self.summarize(request).body

    def close(self) -> None:
        return None


# ------------------------------------------------------------------ one arm, one workload


class Run:
    """Per-turn CPU times and which turns compacted."""

    def __init__(self) -> None:
        self.cpu_ms: list[float] = []
        self.compacted: list[bool] = []
        self.floor_list_ms: list[float] = []
        self.floor_dicts_ms: list[float] = []
        self.after_turn_ms: list[float] = []

    def record(self, cpu_ms: float, compacted: bool) -> None:
        self.cpu_ms.append(cpu_ms)
        self.compacted.append(compacted)


def _dict_copies(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return list(map(dict, messages))


def _repeat_ms(action: Callable[[], object], times: int = 20) -> float:
    started = time.process_time()
    for _ in range(times):
        action()
    return (time.process_time() - started) * 1000 / times


def run_ragent(
    turns: Turns,
    budget: int,
    language: str,
    db: Path,
    *,
    recall: bool = True,
    every_call: bool = False,
    turn_chars: int | None = RECALL_TURN_CHARS,
) -> tuple[Run, Meter, dict]:
    """One arm over ``turns``: ``prepare`` at each user message, or with ``every_call``
    before every model call of the turn (its tool loop's too), then ``after_turn``;
    ``turn_chars``: ``recall.turn_chars`` (the default unless ``benchmarks.turn_cap`` tries
    another)."""
    meter = Meter(language)
    settings = Settings(
        context_window_chars=budget,
        language=language,
        store=StoreSettings(path=str(db)),
        recall_enabled=recall,
        recall=RecallSettings(turn_chars=turn_chars),
    )
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a support agent."}]
    run = Run()
    stability = Stability()
    loop_calls = loop_blocks = recalled_chars = 0
    with MemoryEngine(settings, summarizer=meter) as engine:
        for messages in turns:
            done = 0
            for call, stop in enumerate(model_calls(messages) if every_call else [1]):
                history.extend(messages[done:stop])
                done = stop
                started = time.process_time()
                prepared = engine.prepare(history, session_id="bench")
                cpu_ms = (time.process_time() - started) * 1000
                sent = prepared.messages
                if not every_call:
                    run.floor_list_ms.append(_repeat_ms(functools.partial(list, sent)))
                    # Copying every dict takes 0.1 ms and up: five repeats resolve it well.
                    run.floor_dicts_ms.append(_repeat_ms(functools.partial(_dict_copies, sent), 5))
                stability.add(sent, prepared.report.compacted)
                recalled_chars += prepared.report.recalled_chars
                run.record(cpu_ms, prepared.report.compacted)
                if call:  # a tool loop's call: does it still carry the turn's recall block?
                    loop_calls += 1
                    loop_blocks += carries_block(sent, language)
            history.extend(messages[done:])
            started = time.process_time()
            engine.after_turn(history, session_id="bench")
            run.after_turn_ms.append((time.process_time() - started) * 1000)
        audit = engine.store.compactions("bench")
    applied = [r for r in audit if r["status"] == "applied"]
    extra = {
        "stability": stability.result(),
        "audit_material_chars_equal_read": [r["material_chars"] for r in applied] == meter.material,
        "history_chars": sum(chars(m) for m in history),
        # A block's chars leave the prefix at the event that takes it off (unless a
        # compaction does): their mean over B bounds what recall costs the share.
        "recalled_chars_per_call": recalled_chars / max(1, len(run.cpu_ms)),
        **({"loop_calls": loop_calls, "loop_calls_with_block": loop_blocks} if every_call else {}),
    }
    return run, meter, extra


def carries_block(sent: Sequence[dict[str, Any]], language: str) -> bool:
    """Whether the turn's user message, as sent, carries a recall block (found on this call
    or kept on it from the turn's first call: ``recalled`` counts only the former)."""
    last = next((m for m in reversed(sent) if m.get("role") == "user"), None)
    content = last.get("content") if last is not None else None
    if not isinstance(content, list) or not content:
        return False
    return str(content[0].get("text", "")).startswith(HEADERS[language])


def _common_prefix(
    previous: Sequence[Any], sent: Sequence[Any], same_as_sent: Callable[[Any, Any], bool]
) -> int:
    """How many leading items ``sent`` shares with ``previous``."""
    if previous == sent[: len(previous)]:  # the usual case, one C-level comparison
        return len(previous)
    same = 0
    while same < min(len(previous), len(sent)) and same_as_sent(previous[same], sent[same]):
        same += 1
    return same


class Stability:
    """Prefix stability between consecutive turns, compaction turns excluded."""

    def __init__(
        self,
        size: Callable[[Any], int] = chars,
        same_as_sent: Callable[[Any, Any], bool] = operator.eq,
    ) -> None:
        self.size = size  # of one message as sent, in chars
        self.same_as_sent = same_as_sent  # do two messages send the same thing?
        self.previous: list[Any] | None = None
        self.previous_sizes: list[int] = []
        self.starts_with: list[bool] = []
        self.shares: list[float] = []

    def add(self, sent: Sequence[Any], compacted: bool) -> None:
        sent = list(sent)
        previous = self.previous or []
        same = _common_prefix(previous, sent, self.same_as_sent)
        # Equal messages have equal sizes: only what changed is measured again.
        sizes = self.previous_sizes[:same] + [self.size(m) for m in sent[same:]]
        if self.previous is not None and not compacted:
            self.starts_with.append(same == len(previous))
            total = sum(self.previous_sizes) or 1
            self.shares.append(sum(self.previous_sizes[:same]) / total)
        self.previous, self.previous_sizes = sent, sizes

    def result(self) -> dict[str, float]:
        if not self.starts_with:
            return {"starts_with_previous": 1.0, "mean_matching_share": 1.0, "turns": 0}
        return {
            "starts_with_previous": sum(self.starts_with) / len(self.starts_with),
            "mean_matching_share": statistics.fmean(self.shares),
            "turns": len(self.starts_with),
        }


def _peer_chars(message: Any) -> int:
    """A LangChain message's size as the OpenAI dict it would be sent as."""
    from langchain_core.messages import convert_to_openai_messages

    return chars(convert_to_openai_messages(message))


def _peer_same(a: Any, b: Any) -> bool:
    """Two LangChain messages that would be sent alike: equal but for the ``id`` a
    middleware assigns in place (the OpenAI dict has no id)."""
    return bool(a == b or a.model_copy(update={"id": None}) == b.model_copy(update={"id": None}))


def _char_counter(messages: Any, **_: Any) -> int:
    from langchain_core.messages import convert_to_openai_messages

    return sum(chars(m) for m in convert_to_openai_messages(list(messages)))


def _peer_options(budget: int, meter: Meter) -> dict[str, Any]:
    """What both peers are configured with: the shared summarizer, triggers, char counter."""
    from langchain_core.messages import convert_to_openai_messages

    return {
        "summarizer": lambda messages: meter.text(convert_to_openai_messages(messages)),
        "trigger": ("tokens", int(0.8 * budget)),
        "keep": ("tokens", int(0.2 * budget)),
        "token_counter": _char_counter,
        "trim_tokens_to_summarize": PEER_SUMMARY_INPUT_CHARS,
    }


class _Model:
    """The model call at the end of a peer's middleware: records what it was sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def __call__(self, request: Any) -> Any:
        from langchain.agents.middleware.types import ModelResponse
        from langchain_core.messages import AIMessage

        self.sent = request.messages
        return ModelResponse(result=[AIMessage("ok")])


def run_langchain(
    turns: Turns, budget: int, meter: Meter, *, full: bool, every_call: bool = False
) -> tuple[Run, dict] | None:
    try:
        from langchain.agents.middleware import (
            ClearToolUsesEdit,
            ContextEditingMiddleware,
            SummarizationMiddleware,
        )
        from langchain.agents.middleware.types import ModelRequest
        from langchain_core.language_models.fake_chat_models import FakeListChatModel
        from langchain_core.messages import convert_to_messages
    except ImportError:
        return None
    model = FakeListChatModel(responses=["ok"])
    summarization = SummarizationMiddleware(model=model, **_peer_options(budget, meter))
    editing = ContextEditingMiddleware(
        edits=[ClearToolUsesEdit(trigger=int(0.5 * budget), keep=2)], token_counter=_char_counter
    )
    state: list[Any] = convert_to_messages(
        [{"role": "system", "content": "You are a support agent."}]
    )
    run, stability, handler = Run(), Stability(_peer_chars, _peer_same), _Model()
    for messages in turns:
        converted = convert_to_messages(messages)
        done = 0
        for stop in model_calls(messages) if every_call else [1]:
            state.extend(converted[done:stop])
            done = stop
            started = time.process_time()
            update = summarization.before_model({"messages": state}, None)  # type: ignore[arg-type]
            if update is not None:  # RemoveMessage(all) + summary + kept, as the agent does
                state = list(update["messages"][1:])
            sent = state
            if full:
                editing.wrap_model_call(ModelRequest(model=model, messages=list(state)), handler)
                sent = handler.sent
            cpu_ms = (time.process_time() - started) * 1000
            stability.add(sent, update is not None)
            run.record(cpu_ms, update is not None)
        state.extend(converted[done:])
    return run, {"stability": stability.result()}


def run_deepagents(turns: Turns, budget: int, meter: Meter, tmp: Path) -> tuple[Run, dict] | None:
    try:
        from deepagents.backends import FilesystemBackend
        from deepagents.middleware.summarization import SummarizationMiddleware
        from langchain.agents.middleware.types import ModelRequest
        from langchain_core.language_models.fake_chat_models import FakeListChatModel
        from langchain_core.messages import convert_to_messages
    except ImportError:
        return None
    model = FakeListChatModel(responses=["ok"])
    middleware = SummarizationMiddleware(
        model=model,
        backend=FilesystemBackend(root_dir=str(tmp), virtual_mode=True),
        **_peer_options(budget, meter),
    )
    messages_state: list[Any] = convert_to_messages(
        [{"role": "system", "content": "You are a support agent."}]
    )
    extra_state: dict[str, Any] = {}
    run, stability, handler = Run(), Stability(_peer_chars, _peer_same), _Model()
    for messages in turns:
        converted = convert_to_messages(messages)
        messages_state.append(converted[0])
        state = {"messages": messages_state, **extra_state}
        request = ModelRequest(model=model, messages=list(messages_state), state=state)  # type: ignore[arg-type]
        started = time.process_time()
        response = middleware.wrap_model_call(request, handler)
        cpu_ms = (time.process_time() - started) * 1000
        update = getattr(getattr(response, "command", None), "update", None) or {}
        compacted = "_summarization_event" in update
        extra_state.update({k: v for k, v in update.items() if k != "messages"})
        stability.add(handler.sent, compacted)
        run.record(cpu_ms, compacted)
        messages_state.extend(converted[1:])
    return run, {"stability": stability.result()}


# ------------------------------------------------------------------ the report


def summary(run: Run, meter_sent: Sequence[int], budget: int, history_chars: int) -> dict:
    cpu = run.cpu_ms
    quiet = [t for t, c in zip(cpu, run.compacted, strict=True) if not c] or cpu
    return {
        "turns": len(cpu),
        "p50_ms": statistics.median(cpu),
        "p99_ms": statistics.quantiles(cpu, n=100)[98] if len(cpu) >= 100 else max(cpu),
        "p50_non_compaction_ms": statistics.median(quiet),
        "turns_100_200_p50_ms": statistics.median(cpu[100:200]),
        "last_100_p50_ms": statistics.median(cpu[-100:]),
        "last_100_over_100_200": statistics.median(cpu[-100:]) / statistics.median(cpu[100:200]),
        "compactions": sum(run.compacted),
        "summarizer_calls": len(meter_sent),
        "summarizer_chars_per_call_over_b": (
            statistics.fmean(meter_sent) / budget if meter_sent else 0.0
        ),
        "summarizer_max_chars_over_b": max(meter_sent) / budget if meter_sent else 0.0,
        "summarizer_calls_per_100k_history_chars": len(meter_sent) * 100_000 / history_chars,
        **(
            {"after_turn_p50_ms": statistics.median(run.after_turn_ms)} if run.after_turn_ms else {}
        ),
    }


class Clock:
    """Wall and CPU seconds of each part of the run (what makes ``make bench`` long)."""

    def __init__(self) -> None:
        self.parts: dict[str, tuple[float, float]] = {}

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.parts[name] = (time.perf_counter() - wall, time.process_time() - cpu)


def run_peers(
    turns: Turns,
    budget: int,
    language: str,
    history_chars: int,
    tmp: Path,
    clock: Clock,
    workload: str,
) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    runners: dict[str, Callable[[Meter], tuple[Run, dict[str, Any]] | None]] = {
        "langchain_full": lambda m: run_langchain(turns, budget, m, full=True),
        "langchain_summarization": lambda m: run_langchain(turns, budget, m, full=False),
        "deepagents": lambda m: run_deepagents(turns, budget, m, tmp / "deep"),
    }
    for arm, runner in runners.items():
        gc.collect()
        meter = Meter(language)
        with clock.part(f"{workload} {arm}"):
            outcome = runner(meter)
        if outcome is None:
            rows[arm] = {"missing": "package not installed"}
            continue
        run, extra = outcome
        rows[arm] = {**summary(run, meter.sent, budget, history_chars), **extra}
    return rows


class SlowSummarizer(Meter):
    """The offline summarizer behind a model that takes ``delay_s`` per call."""

    def __init__(self, language: str, delay_s: float) -> None:
        super().__init__(language)
        self.delay_s = delay_s

    def summarize(self, request: SummaryRequest) -> SummaryOutcome:
        time.sleep(self.delay_s)  # a slow model, on the engine's worker thread
        return super().summarize(request)


def slow_model(
    turns: Turns, budget: int, db: Path, delay_s: float = 30.0, recall: bool = True
) -> dict[str, Any]:
    """compaction_timeout_s: 0 with a summarizer taking ``delay_s``: prepare never waits (its
    p99 stays a few ms), the ceiling keeps every turn within B meanwhile, and the summary is
    adopted by the first prepare after it landed."""
    settings = Settings(
        context_window_chars=budget,
        compaction_timeout_s=0,
        store=StoreSettings(path=str(db)),
        recall_enabled=recall,
    )
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a support agent."}]
    cpu_ms, process_ms, wall_ms, over_budget, generations = [], [], [], 0, []
    stability = Stability()
    with MemoryEngine(settings, summarizer=SlowSummarizer("en", delay_s)) as engine:
        for messages in turns:
            history.append(messages[0])
            # The calling thread's CPU: process time would also charge each turn with what
            # the compaction worker (summarizer, retention check) burns meanwhile.
            started = time.thread_time(), time.process_time(), time.perf_counter()
            prepared = engine.prepare(history, session_id="slow")
            cpu_ms.append((time.thread_time() - started[0]) * 1000)
            process_ms.append((time.process_time() - started[1]) * 1000)
            wall_ms.append((time.perf_counter() - started[2]) * 1000)
            report = prepared.report
            stability.add(prepared.messages, report.compacted)
            over_budget += report.chars_out > budget
            generations.append(report.generation)
            history.extend(messages[1:])
            engine.after_turn(history, session_id="slow")
        landed = engine.flush(timeout_s=delay_s * 3)
        history.append({"role": "user", "content": "and now?"})
        after = engine.prepare(history, session_id="slow").report
    return {
        "summarizer_delay_s": delay_s,
        "turns": len(cpu_ms),
        "p50_ms": statistics.median(cpu_ms),
        "p99_ms": statistics.quantiles(cpu_ms, n=100)[98],
        "p99_process_ms": statistics.quantiles(process_ms, n=100)[98],
        "p99_wall_ms": statistics.quantiles(wall_ms, n=100)[98],
        "turns_over_b": over_budget,
        "generation_during_session": max(generations),
        "landed_within_3x_delay": landed,
        "adopted_after_landing": after.generation > max(generations),
        # while the summary is being written (the ceiling's rungs keep the turn within B)
        "stability": stability.result(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a quarter of every workload")
    parser.add_argument(
        "--only", help="comma-separated workload names (and/or 'slow_model', 'every_call')"
    )
    parser.add_argument("--no-peers", action="store_true", help="ragent_memory's arms alone")
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    logging.getLogger("ragent_memory").setLevel(logging.WARNING)
    results: dict[str, Any] = {"quick": args.quick, "workloads": {}}
    # A quick or partial run (ours alone included) prints its tables and leaves the results
    # file alone: docs/benchmarks.md reads every table of it from one whole run.
    partial = args.quick or only is not None or args.no_peers
    out = None if partial else RESULTS / "versus.json"
    clock = Clock()
    rag_en: Turns = []
    for name, budget, turns in workloads(args.quick):
        rag_en = rag_en or turns  # the slow-model run replays the 2,000-turn RAG session
        if only is not None and name not in only:
            continue
        language = language_of(name)
        history_chars = sum(chars(m) for t in turns for m in t)
        rows: dict[str, Any] = {}
        with tempfile.TemporaryDirectory() as tmp:
            gc.collect()
            with clock.part(f"{name} ragent_memory"):
                ours, meter, extra = run_ragent(turns, budget, language, Path(tmp) / "bench.db")
            rows["ragent_memory"] = {**summary(ours, meter.sent, budget, history_chars), **extra}
            rows["floor_list"] = {"p50_ms": statistics.median(ours.floor_list_ms)}
            rows["floor_dicts"] = {"p50_ms": statistics.median(ours.floor_dicts_ms)}
            # Recall (docs/design.md §9b) searches on every user turn and no peer has it: the same
            # engine without it shows what the rest of the turn costs.
            gc.collect()
            with clock.part(f"{name} ragent_memory recall off"):
                bare, meter, extra = run_ragent(
                    turns, budget, language, Path(tmp) / "bare.db", recall=False
                )
            rows["ragent_memory_recall_off"] = {
                **summary(bare, meter.sent, budget, history_chars),
                **extra,
            }
            if not args.no_peers:
                rows.update(
                    run_peers(turns, budget, language, history_chars, Path(tmp), clock, name)
                )
        ours_p50 = rows["ragent_memory"]["p50_ms"]
        for arm, row in rows.items():
            if arm != "ragent_memory" and "p50_ms" in row:
                row["ratio_to_ragent_p50"] = row["p50_ms"] / ours_p50
        results["workloads"][name] = {"budget": budget, "history_chars": history_chars, **rows}
        print_table(name, budget, rows)
        write(results, out)  # after every workload: a run cut short keeps what it measured
    for name, budget, turns in workloads(args.quick):
        if name not in EVERY_CALL or (only is not None and "every_call" not in only):
            continue
        rows = every_call(turns, budget, clock, name, peers=not args.no_peers)
        results.setdefault("every_call", {})[name] = {"budget": budget, **rows}
        print_table(f"{name}, a model call after every tool loop", budget, rows)
        write(results, out)
    for key, recall in (("slow_model", True), ("slow_model_recall_off", False)):
        if only is not None and "slow_model" not in only:
            break
        with tempfile.TemporaryDirectory() as tmp, clock.part(key.replace("_", " ")):
            slow = slow_model(
                rag_en, 200_000, Path(tmp) / "slow.db", 5.0 if args.quick else 30.0, recall
            )
        results[key] = slow
        print(
            f"\n{key} ({slow['summarizer_delay_s']:.0f} s per summary, "
            f"compaction_timeout_s: 0): prepare (calling thread's CPU) p50 "
            f"{slow['p50_ms']:.3f} ms, p99 {slow['p99_ms']:.2f} ms (process CPU "
            f"{slow['p99_process_ms']:.2f}, wall {slow['p99_wall_ms']:.2f}) over "
            f"{slow['turns']} turns; {slow['turns_over_b']} turns over B; summary adopted "
            f"once landed: {slow['adopted_after_landing']}; cached share "
            f"{slow['stability']['mean_matching_share']:.3f}"
        )
    results["elapsed_s"] = clock.parts
    write(results, out)
    print(f"\nwritten: {out or 'nothing (a quick or partial run)'}")
    print(f"\n{'part':<36} {'wall s':>8} {'CPU s':>8}")
    for part, (wall_s, cpu_s) in clock.parts.items():
        print(f"{part:<36} {wall_s:>8.1f} {cpu_s:>8.1f}")


# A real tool-calling agent calls the model again after each tool loop, and each call goes
# through the memory engine (``prepare``, or the peer's middleware) first; the tables above
# prepare at each user message only. These workloads are run again that way.
EVERY_CALL = ("rag_2000_en", "rag_2000_zh", "tools_5_per_turn")


def every_call(
    turns: Turns, budget: int, clock: Clock, name: str, *, peers: bool
) -> dict[str, Any]:
    """``turns`` with a call before every model call: ragent_memory with and without recall
    (how many tool-loop calls still carry the turn's recall block), and LangChain's full
    stack, each arm on the same calls."""
    rows: dict[str, Any] = {}
    history_chars = sum(chars(m) for t in turns for m in t)
    language = language_of(name)
    with tempfile.TemporaryDirectory() as tmp:
        for arm, recall in (("ragent_memory", True), ("ragent_memory_recall_off", False)):
            gc.collect()
            with clock.part(f"{name} every call {arm}"):
                run, meter, extra = run_ragent(
                    turns,
                    budget,
                    language,
                    Path(tmp) / f"{arm}.db",
                    recall=recall,
                    every_call=True,
                )
            rows[arm] = {**summary(run, meter.sent, budget, history_chars), **extra}
    if peers:
        gc.collect()
        meter = Meter(language)
        with clock.part(f"{name} every call langchain_full"):
            outcome = run_langchain(turns, budget, meter, full=True, every_call=True)
        if outcome is None:
            rows["langchain_full"] = {"missing": "package not installed"}
        else:
            run, extra = outcome
            rows["langchain_full"] = {**summary(run, meter.sent, budget, history_chars), **extra}
    ours = rows["ragent_memory"]["p50_ms"]
    for arm, row in rows.items():
        if arm != "ragent_memory" and "p50_ms" in row:
            row["ratio_to_ragent_p50"] = row["p50_ms"] / ours
    return rows


def write(results: dict[str, Any], out: Path | None) -> None:
    if out is None:
        return
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")


def print_table(name: str, budget: int, rows: dict[str, Any]) -> None:
    print(f"\n{name}, B = {budget:,} chars")
    header = (
        f"{'arm':<24} {'p50 ms':>8} {'p99 ms':>8} {'100-200':>8} {'last100':>8} "
        f"{'late/early':>10} {'×ours':>7} {'prefix':>7} {'share':>6} {'sum/B':>6} {'calls/100k':>10}"
    )
    print(header)
    for arm, row in rows.items():
        if "missing" in row:
            print(f"{arm:<24} {row['missing']}")
            continue
        if "turns" not in row:
            print(
                f"{arm:<24} {row['p50_ms']:>8.4f} {'':>8} {'':>8} {'':>8} {'':>10} "
                f"{row.get('ratio_to_ragent_p50', 1):>7.3f}"
            )
            continue
        stability = row["stability"]
        print(
            f"{arm:<24} {row['p50_ms']:>8.3f} {row['p99_ms']:>8.2f} "
            f"{row['turns_100_200_p50_ms']:>8.3f} {row['last_100_p50_ms']:>8.3f} "
            f"{row['last_100_over_100_200']:>10.2f} {row.get('ratio_to_ragent_p50', 1):>7.2f} "
            f"{stability['starts_with_previous']:>7.1%} {stability['mean_matching_share']:>6.3f} "
            f"{row['summarizer_chars_per_call_over_b']:>6.2f} "
            f"{row['summarizer_calls_per_100k_history_chars']:>10.3f}"
        )
        if "after_turn_p50_ms" in row:
            print(f"{'  + after_turn':<24} {row['after_turn_p50_ms']:>8.3f}")
        if "loop_calls" in row:
            print(
                f"{'  tool-loop calls':<24} {row['loop_calls_with_block']:,} of "
                f"{row['loop_calls']:,} carry the turn's recall block"
            )


if __name__ == "__main__":
    main()
