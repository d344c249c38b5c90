"""The summarizer's input is bounded by B (docs/design.md §5, §6): the rendered transcript
clips tool results first, then assistant and user text, then leaves out the oldest messages;
what was sent is what the audit's ``material_chars`` says; identifiers the clip hid come back
through the retention check."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import attrs
from fake_openai import FakeOpenAI, fake_openai  # noqa: F401
from sessions import rows

from ragent_memory import LLMSettings, Settings, StoreSettings
from ragent_memory.core.identifiers import identifiers
from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.summary.build import build_summarizer
from ragent_memory.summary.offline import NAME as OFFLINE
from ragent_memory.summary.offline import OfflineSummarizer
from ragent_memory.summary.prompt import SECTIONS
from ragent_memory.summary.summarize import SummaryRequest
from ragent_memory.summary.transcript import DEFAULT_CLIP, UNCLIPPED, Clip, Transcript, clip_text

B = 20_000
TASK = "Reconcile the ledgers and never approve more than 500 euros without my OK."
PLANTED = [
    "Invoice INV-2024-0042 from Acme Robotics totals €4,321.50.",
    "Refund ORD-77341 was paid to dana.kim@example.com on 2024-03-05.",
    "The audit file is /srv/ledger/q3-close.csv at https://ledger.example.com/q3.",
]
# Filler without identifiers: lower-case words and full stops only.
FILLER = "the ledger lists routine entries and nothing stands out here. "
BODY = "\n".join(f"{title}\n- written by the model" for title in SECTIONS["en"])
LOST_NOTE = "lost these identifiers"


def report(turn: int, size: int) -> str:
    """A tool result of ``size`` chars with a planted sentence in its middle third."""
    half = FILLER * (size // 2 // len(FILLER))
    return f"Report {turn}. {half}{PLANTED[turn % len(PLANTED)]} {half}"


def huge_history(turns: int = 14, size: int = 60_000) -> list[dict[str, Any]]:
    """System + task + ``turns`` tool loops whose results are each far larger than B."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a bookkeeping agent."},
        {"role": "user", "content": TASK},
    ]
    for turn in range(turns):
        call_id = f"call_{turn}"
        call = {"name": "fetch_report", "arguments": f'{{"report": {turn}}}'}
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": call}],
            },
            {"role": "tool", "tool_call_id": call_id, "content": report(turn, size)},
            {"role": "assistant", "content": f"Report {turn} is reconciled."},
            {"role": "user", "content": f"Good. Next, report {turn + 1}."},
        ]
    return messages


def fenced(content: str, kind: str) -> str:
    """The text inside the prompt's real ``kind`` fence (the nonce read off the prompt)."""
    nonce = re.search(rf'<{kind} nonce="([0-9a-f]+)">\n', content)
    assert nonce is not None
    opening = f'<{kind} nonce="{nonce.group(1)}">\n'
    return content.split(opening, 1)[1].split(f'\n</{kind} nonce="{nonce.group(1)}">', 1)[0]


def sent_chars(body: Any) -> int:
    """Every char of content one request sent: instructions, previous summary, transcript."""
    return sum(len(m["content"]) for m in body["messages"])


def model_engine(
    server: FakeOpenAI, make_engine: Callable[..., MemoryEngine], db_path: str, **llm: Any
) -> MemoryEngine:
    settings = Settings(
        context_window_chars=B,
        store=StoreSettings(path=db_path),
        llm=LLMSettings(base_url=server.base_url, model="m", timeout_s=5.0, max_retries=0, **llm),
    )
    return make_engine(settings, summarizer=build_summarizer(settings))


def assert_planted_kept(summary: str) -> None:
    for sentence in PLANTED:
        for identifier in identifiers(sentence):
            assert identifier in summary, identifier


# ---------------------------------------------------------------------------- pure parts


def test_filler_holds_no_identifier() -> None:
    """The planted sentences are the only identifiers of the material (the test relies on it)."""
    assert [] == identifiers(FILLER * 3)
    assert all(identifiers(sentence) for sentence in PLANTED)


def test_clip_text_keeps_head_and_tail_within_the_cap() -> None:
    """Two thirds head, one third tail, the omitted count in between; §1's 1,200 unchanged."""
    text = "h" * 500 + "m" * 1000 + "t" * 500
    assert "h" * 200 + "…(1700 chars omitted)…" + "t" * 100 == clip_text(text, 300)
    assert "h" * 500 + "m" * 300 + "…(800 chars omitted)…" + "t" * 400 == clip_text(text, 1_200)
    assert text == clip_text(text, None) == clip_text(text, 2_000)
    assert "abcdefghij" == clip_text("abcdefghij", 3)  # a marker longer than what it hides


def test_fit_leaves_material_that_fits_alone() -> None:
    """Material within the budget renders as docs/design.md §1 says: nothing clipped harder."""
    transcript = Transcript(huge_history(2, 3_000))
    assert DEFAULT_CLIP == transcript.fit(100_000)
    assert UNCLIPPED == transcript.fit(100_000, start=UNCLIPPED)


def test_fit_clips_tool_results_before_anyone_speaking() -> None:
    """Large material is clipped in tool results first; the user's and assistant's words
    stay whole while that is enough."""
    material = huge_history()
    transcript = Transcript(material)
    clip = transcript.fit(10_000)
    rendered = transcript.render(clip)

    assert len(rendered) <= 10_000
    assert clip.tool is not None and clip.tool < 1_200
    assert (1_200, 1_200, 0) == (clip.assistant, clip.user, clip.omitted)
    assert f"[user] {TASK}" in rendered
    assert "[assistant] Report 13 is reconciled." in rendered
    assert "chars omitted)…" in rendered
    # The gentlest clip: one char more for tool results would not fit.
    assert len(transcript.render(Clip(tool=clip.tool + 1))) > 10_000


def test_fit_leaves_out_the_oldest_messages_last() -> None:
    """A budget smaller than every text at its floor leaves out the oldest messages, says
    how many, and still fits."""
    material = [{"role": "user", "content": f"question {i}: " + "why? " * 40} for i in range(200)]
    transcript = Transcript(material)
    clip = transcript.fit(2_000)
    rendered = transcript.render(clip)

    assert (0, 0, 0) == (clip.tool, clip.assistant, clip.user)
    assert 0 < clip.omitted < 200
    assert len(rendered) <= 2_000
    assert rendered.startswith(f"[{clip.omitted} earlier messages omitted]\n[user] …(")
    assert len(transcript.render(attrs.evolve(clip, omitted=clip.omitted - 1))) > 2_000


def test_chunks_of_a_fitted_transcript_add_up_to_no_more_than_it() -> None:
    """Chunks start at user turns, each within the room, their lengths summing to at most
    the whole fitted rendering."""
    transcript = Transcript(huge_history())
    clip = transcript.fit(15_000)
    chunks = transcript.chunks(clip, 4_000)

    assert len(chunks) > 1
    assert all(len(c) <= 4_000 for c in chunks)
    assert sum(map(len, chunks)) <= len(transcript.render(clip)) <= 15_000
    assert all(c.startswith("[user]") for c in chunks[1:])  # the first: the system prompt


def test_offline_reads_whole_material_when_it_fits_and_says_how_much() -> None:
    """Small material: the offline summarizer reads it unclipped; material_chars is the
    transcript of what it read."""
    material = tuple(huge_history(2, 3_000))
    outcome = OfflineSummarizer().summarize(
        SummaryRequest(material, "", "en", 2_000, input_chars=100_000)
    )
    assert len(Transcript(material).render(UNCLIPPED)) == outcome.material_chars


def test_offline_reads_a_clipped_material_within_b() -> None:
    """Huge material: the offline summarizer reads it clipped so that the transcript plus
    the previous summary fit ``input_chars``."""
    material = tuple(huge_history())
    previous = "## Done\n- " + "earlier work. " * 100
    request = SummaryRequest(material, previous, "en", 2_000, input_chars=B)
    outcome = OfflineSummarizer().summarize(request)

    assert outcome.material_chars is not None
    assert B - 1_500 <= outcome.material_chars + len(previous) <= B


# ---------------------------------------------------------------------------- end to end


def test_model_path_sends_at_most_b_and_the_audit_says_what_was_sent(
    fake_openai: FakeOpenAI, make_engine: Callable[..., MemoryEngine], db_path: str
) -> None:
    """Tool results 3× B each: every request, seen by the server, holds a transcript of at
    most B — the whole pass (instructions and previous summary included) too; the audit's
    material_chars is the transcript the server received in the pass that wrote the summary;
    the identifiers the clip hid are in the summary (the retention check restores them)."""
    fake_openai.default = lambda _body: BODY
    engine = model_engine(fake_openai, make_engine, db_path, retention_retry=True)
    material = huge_history()
    prepared = engine.prepare(material, session_id="s1")

    assert prepared.report.compacted
    [row] = rows(db_path)
    assert "applied" == row["status"]
    requests = [r.body for r in fake_openai.requests]
    first = [b for b in requests if LOST_NOTE not in b["messages"][1]["content"]]
    retry = [b for b in requests if LOST_NOTE in b["messages"][1]["content"]]
    assert first and retry  # the model lost the identifiers: the opt-in retry names them
    for one_pass in (first, retry):
        assert sum(map(sent_chars, one_pass)) <= B
    transcripts = [fenced(b["messages"][1]["content"], "transcript") for b in retry]
    assert sum(map(len, transcripts)) == row["material_chars"]
    assert row["material_chars"] <= B
    assert sum(len(str(m.get("content") or "")) for m in material) > 30 * B
    assert any("chars omitted)…" in t for t in transcripts)
    assert all(not any(p in t for p in PLANTED) for t in transcripts)  # the clip hid them
    assert_planted_kept(row["summary"])
    assert f"> {TASK}" in row["summary"]


def test_model_path_chunks_each_within_max_input_and_the_pass_within_b(
    fake_openai: FakeOpenAI, make_engine: Callable[..., MemoryEngine], db_path: str
) -> None:
    """With llm.max_input_chars under B the clipped transcript folds in chunks: each call
    within max_input_chars, the calls of a pass within B, the audit the sum of the chunks."""
    fake_openai.default = lambda body: BODY.replace("model", f"call {len(fake_openai.requests)}")
    engine = model_engine(fake_openai, make_engine, db_path, max_input_chars=10_000)
    engine.prepare(huge_history(), session_id="s1")

    [row] = rows(db_path)
    requests = [r.body for r in fake_openai.requests]
    kept = [b for b in requests if LOST_NOTE in b["messages"][1]["content"]] or requests
    assert len(kept) >= 2
    assert all(sent_chars(b) <= 10_000 for b in requests)
    assert sum(map(sent_chars, kept)) <= B
    assert row["material_chars"] == sum(
        len(fenced(b["messages"][1]["content"], "transcript")) for b in kept
    )
    assert_planted_kept(row["summary"])


def test_offline_path_reads_at_most_b_and_restores_what_the_clip_hid(
    make_engine: Callable[..., MemoryEngine], db_path: str
) -> None:
    """The offline summarizer reads the same huge material clipped within B, the audit says
    how much, and the planted identifiers are in the summary all the same."""
    settings = Settings(context_window_chars=B, store=StoreSettings(path=db_path))
    engine = make_engine(settings)
    prepared = engine.prepare(huge_history(), session_id="s1")

    assert prepared.report.compacted
    [row] = rows(db_path)
    assert (OFFLINE, "applied") == (row["model"], row["status"])
    assert 0 < row["material_chars"] <= B
    assert_planted_kept(row["summary"])
