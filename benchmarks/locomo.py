"""Retention on LoCoMo: how much of a long conversation survives in the prepared context.

Each LoCoMo conversation (speaker A as the user, speaker B as the assistant, the session date
in front of each session's first message) is replayed through the engine turn by turn with the
offline summarizer. At the end we ask, for every question of categories 1–4 (5 has no answer
in the conversation), whether what is needed to answer it is still in the context:

- evidence: the share of the question's evidence utterances whose content words are (≥ 80%)
  present in the context;
- answer: whether every content word of the gold answer is present in the context.

The baseline is a sliding window given exactly as many characters as the engine's final
context (the last messages that fit), measured in the same run. Data: ../shared/bench-data.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
from pathlib import Path
from typing import Any

import structlog

from ragent_memory import MemoryEngine, Settings, StoreSettings
from ragent_memory.chars import chars, text_of

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "bench-data" / "locomo"
STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "of",
        "to",
        "in",
        "on",
        "at",
        "for",
        "with",
        "by",
        "from",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "it",
        "its",
        "this",
        "that",
        "i",
        "you",
        "he",
        "she",
        "we",
        "they",
        "my",
        "your",
        "her",
        "his",
        "our",
        "their",
        "me",
        "him",
        "them",
        "do",
        "did",
        "does",
        "so",
        "as",
        "but",
        "not",
        "no",
        "what",
        "when",
        "where",
        "who",
        "how",
        "why",
        "which",
    ]
)
WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> set[str]:
    return {w for w in WORD.findall(text.lower()) if w not in STOP}


def conversation(data: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The messages, and the text of every dialogue id."""
    user = data["speaker_a"]
    numbers = sorted(
        int(k.split("_")[1]) for k in data if re.fullmatch(r"session_\d+", k) and data[k]
    )
    messages: list[dict[str, Any]] = []
    texts: dict[str, str] = {}
    for number in numbers:
        when = data.get(f"session_{number}_date_time", "")
        for k, turn in enumerate(data[f"session_{number}"]):
            text = turn["text"]
            if turn.get("blip_caption"):
                text += f" [shares a photo: {turn['blip_caption']}]"
            texts[turn["dia_id"]] = text
            prefix = f"[session {number} · {when}] " if k == 0 else ""
            role = "user" if turn["speaker"] == user else "assistant"
            messages.append({"role": role, "content": f"{prefix}{turn['speaker']}: {text}"})
    messages.append({"role": "user", "content": "(end of conversation)"})
    return messages, texts


def window(messages: list[dict[str, Any]], size: int) -> list[dict[str, Any]]:
    kept, total = [], 0
    for message in reversed(messages):
        total += chars(message)
        if total > size:
            break
        kept.append(message)
    return kept[::-1]


def score(
    context: list[dict[str, Any]], qa: list[dict[str, Any]], texts: dict[str, str]
) -> tuple[float, float]:
    present = words("\n".join(text_of(m) for m in context))
    evidence, answers = [], []
    for item in qa:
        needed = [words(texts[d]) for d in item["evidence"] if d in texts]
        if needed:
            evidence.append(
                sum(len(w & present) >= 0.8 * len(w) for w in needed if w) / len(needed)
            )
        gold = words(str(item["answer"]))
        if gold:
            answers.append(float(gold <= present))
    return sum(evidence) / len(evidence), sum(answers) / len(answers)


def run_one(path: Path, budget: int, tmp: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    messages, texts = conversation(data)
    qa = [q for q in data["qa"] if q.get("category") in (1, 2, 3, 4) and "answer" in q]
    settings = Settings(
        context_window_chars=budget, store=StoreSettings(path=str(tmp / f"{path.stem}-{budget}.db"))
    )
    prepared = None
    with MemoryEngine(settings) as engine:
        for index, message in enumerate(messages):
            if message["role"] == "user":
                prepared = engine.prepare(messages[: index + 1], session_id=path.stem)
    assert prepared is not None
    size = prepared.report.chars_out
    engine_scores = score(prepared.messages, qa, texts)
    window_scores = score(window(messages, size), qa, texts)
    return {
        "conv": path.stem,
        "budget": budget,
        "history": sum(chars(m) for m in messages),
        "context": size,
        "generation": prepared.report.generation,
        "engine": engine_scores,
        "window": window_scores,
        "questions": len(qa),
    }


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    files = sorted(DATA.glob("conv-*.json"))
    if not files:
        print(f"LoCoMo data not found under {DATA}; skipping the retention benchmark")
        return
    print("LoCoMo retention (categories 1–4): engine vs a sliding window of the same size\n")
    header = (
        f"{'conv':<8} {'B':>7} {'history':>8} {'context':>8} {'gen':>4} "
        f"{'evidence eng/win':>17} {'answer eng/win':>15}"
    )
    print(header)
    totals = {"engine": [0.0, 0.0], "window": [0.0, 0.0]}
    rows = 0
    with tempfile.TemporaryDirectory() as tmp:
        for budget in (16_000, 32_000):
            for path in files:
                r = run_one(path, budget, Path(tmp))
                e, w = r["engine"], r["window"]
                print(
                    f"{r['conv']:<8} {budget:>7,} {r['history']:>8,} {r['context']:>8,} "
                    f"{r['generation']:>4} {e[0]:>8.2f}/{w[0]:<8.2f} {e[1]:>7.2f}/{w[1]:<7.2f}"
                )
                for name in totals:
                    totals[name][0] += r[name][0]
                    totals[name][1] += r[name][1]
                rows += 1
    e_ev, e_an = (v / rows for v in totals["engine"])
    w_ev, w_an = (v / rows for v in totals["window"])
    print(f"\nmean evidence retained: engine {e_ev:.2f} vs window {w_ev:.2f} (× {e_ev / w_ev:.2f})")
    print(f"mean answers retained:  engine {e_an:.2f} vs window {w_an:.2f} (× {e_an / w_an:.2f})")


if __name__ == "__main__":
    main()
