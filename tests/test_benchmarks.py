"""The benchmarks that time recall at scale still run on the engine's public names: a rename
in the package once broke ``make bench`` while every test passed (nothing here ran them)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks import beam, beam_misses, report, scale, turn_cap
from ragent_memory.cli.demo import simulate_session


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


def _tiny_beam(root: Path) -> Path:
    """A BEAM-shaped chat of two batches (its format: batches of turn groups, a date anchor on
    the user's messages, questions by kind): details said once early (one in a long reply,
    where no word of its question leads), long replies after."""
    filler = "We tuned the worker pool and looked at the latency graphs again. " * 30
    turns = [
        [
            {
                "role": "user",
                "time_anchor": "January-05-2024",
                "content": "My staging database "
                "is called quokka-db and the deploy deadline is March 1.",
            },
            {"role": "assistant", "content": filler + "Zanzibar. " + filler},
        ],
        *(
            [
                {
                    "role": "user",
                    "time_anchor": "January-06-2024",
                    "content": f"Step {n}: review the worker pool settings again.",
                },
                {"role": "assistant", "content": filler},
            ]
            for n in range(8)
        ),
    ]
    batches = [
        {"batch_number": "1", "turns": turns[:4], "time_anchor": "None"},
        {"batch_number": "2", "turns": turns[4:], "time_anchor": "None"},
    ]
    questions = {
        "information_extraction": [
            {"question": "What is my staging database called?", "answer": "quokka-db"},
            {"question": "Which deadline did I give for the deploy?", "answer": "March 1"},
            {"question": "Where is my cat's vet?", "answer": "Zanzibar"},  # no word in common
        ],
        "event_ordering": [
            {"question": "In what order did we do things?", "answer": "pelican then walrus"},
        ],
    }
    chat = root / "1"
    chat.mkdir(parents=True)
    (chat / "chat.json").write_text(json.dumps(batches))
    (chat / "probing_questions.json").write_text(json.dumps(questions))
    return chat


def test_the_beam_miss_classifier_writes_what_the_docs_show(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``benchmarks.beam_misses`` run whole (both protocols) writes its classes, which
    docs/benchmarks.md renders; a gold the chat never states is not counted as answerable."""
    _tiny_beam(tmp_path / "beam")
    out = tmp_path / "beam_misses.json"
    monkeypatch.setattr(beam_misses, "DATA", tmp_path / "beam")
    monkeypatch.setattr(beam_misses, "RESULTS", out)
    monkeypatch.setattr(sys, "argv", ["beam_misses", "--budget", "8000"])
    beam_misses.main()
    data = json.loads(out.read_text())
    assert set(data["protocols"]) == {"question", "sessions"}
    for run in data["protocols"].values():
        assert run["answerable"] == 3  # "pelican then walrus" is never said
        assert sum(n for kinds in run["classes"].values() for n in kinds.values()) == run["missed"]
    # a fresh session: nothing leads from the cat's vet to "Zanzibar"
    assert data["protocols"]["sessions"]["classes"] == {
        "no shared word": {"information_extraction": 1}
    }
    section = "\n".join(report.beam_misses_section(data))
    assert "Why the engine misses (B = 8,000)" in section
    cells = [f"{r['missed']} / {r['answerable']}" for r in data["protocols"].values()]
    assert f"| **missed / answerable** | {cells[0]} | {cells[1]} |" in section
    assert "| no shared word (it shares no word with the question) |" in section
    assert report.beam_misses_section(None) == []


def test_the_beam_run_reports_the_room_its_recall_blocks_had(tmp_path: Path) -> None:
    """The engine arms' rows say how many chars the question's recall block took."""
    chat = _tiny_beam(tmp_path / "beam")
    sessions = beam.chat_sessions(json.loads((chat / "chat.json").read_text()))
    qa = beam.chat_questions(chat / "probing_questions.json")
    row = beam.run_chat(sessions, qa, 8_000, tmp_path, "tiny", beam.ARMS).row()
    assert row["engine"]["mean_block_chars"] > 0
    assert row["sessions"]["mean_block_chars"] > 0
    assert "mean_block_chars" not in row["full"]


def _tiny_locomo(root: Path) -> Path:
    """A LoCoMo-shaped conversation: two speakers, two dated sessions, questions by category
    (5 has no answer and is not asked)."""

    def said(k: int) -> dict[str, str]:
        speaker = "Ann" if k % 2 == 0 else "Bob"
        return {"speaker": speaker, "text": f"Turn {k}: we talked about the garden again. " * 6}

    first = [{"speaker": "Ann", "text": "I adopted a greyhound called Biscuit last spring."}]
    data = {
        "speaker_a": "Ann",
        "speaker_b": "Bob",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": first + [said(k) for k in range(1, 20)],
        "session_2_date_time": "2:10 pm on 20 May, 2023",
        "session_2": [said(k) for k in range(20, 40)],
        "qa": [
            {"question": "What is the name of Ann's dog?", "answer": "Biscuit", "category": 1},
            {"question": "Which breed did Ann adopt?", "answer": "greyhound", "category": 4},
            {"question": "What did Bob never say?", "answer": "nothing", "category": 5},
        ],
    }
    root.mkdir(parents=True)
    path = root / "conv-1.json"
    path.write_text(json.dumps(data))
    return path


def test_the_turn_cap_benchmark_gives_each_cap_to_the_engine(tmp_path: Path) -> None:
    """``benchmarks.turn_cap`` drives the same data under each ``recall.turn_chars``: a cap
    below the room keeps a later turn's block within it where no cap lets the block take the
    room, every row has its retention and cached shares, and docs/benchmarks.md shows a row
    per cap."""
    chat = _tiny_beam(tmp_path / "beam")
    conv = _tiny_locomo(tmp_path / "locomo")
    workloads = [("rag_2000_en", 12_000, simulate_session(40))]
    results = turn_cap.run((1_000, None), [chat], [conv], workloads, budgets=(12_000,))
    capped, free = results["caps"]["1000"], results["caps"]["none"]
    assert 0 < capped["locomo"]["12000"]["mean_block_chars"] <= 1_000
    assert free["locomo"]["12000"]["mean_block_chars"] > 1_000
    assert capped["beam"]["12000"]["mean_block_chars"] <= 1_000  # long excerpts: none fit
    assert free["beam"]["12000"]["mean_block_chars"] > 1_000
    for row in (capped, free):
        assert 0.0 <= row["beam"]["12000"]["answers"] <= 1.0
        assert row["locomo"]["12000"]["questions"] == 2  # category 5 is not asked
        shares = row["cache"]["rag_2000_en"]
        assert 0.0 < shares["per_turn"] <= 1.0 and 0.0 < shares["per_model_call"] <= 1.0
    assert capped["cache"]["rag_2000_en"]["per_turn_block_chars"] <= 1_000
    section = "\n".join(report.turn_cap_section(results))
    assert "What the later turns' recall cap trades" in section
    assert "\n| 1,000 | " in section and "\n| none | " in section
