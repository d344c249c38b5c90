"""The offline summarizer: deterministic, sectioned, merging, clamped."""

from __future__ import annotations

import json
from typing import Any

from ragent_memory.summary.offline import OfflineSummarizer, parse_sections, summarize_offline
from ragent_memory.summary.prompt import SECTIONS
from ragent_memory.summary.summarize import SummaryRequest
from ragent_memory.summary.validate import section_count


def material(topic: str, n: int = 3) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        out += [
            {"role": "user", "content": f"Look up {topic} {i}, please."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"{topic}{i}",
                        "type": "function",
                        "function": {
                            "name": "search_knowledge",
                            "arguments": json.dumps({"q": topic}),
                        },
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": f"{topic}{i}",
                "content": "No results found." if i == 1 else f"{topic} doc says yes.",
            },
            {"role": "assistant", "content": f"Done: {topic} {i} checked. Next I will compare."},
        ]
    return out


def test_sections_and_content() -> None:
    """All seven sections; the latest request, tools, dead ends and done items survive."""
    body = summarize_offline(material("refunds"), "", "en", 6000)
    assert list(SECTIONS["en"]) == [line for line in body.splitlines() if line.startswith("## ")]
    items = parse_sections(body, "en")
    assert "(user) Look up refunds 2, please." == items[1][0]  # newest to-do first
    assert any("search_knowledge" in t for t in items[4])
    assert any("No results" in t for t in items[5])
    assert any("Done: refunds" in t for t in items[6])


def test_deterministic() -> None:
    """Same input, same output."""
    a = summarize_offline(material("x"), "", "en", 3000)
    assert a == summarize_offline(material("x"), "", "en", 3000)


def test_merges_with_previous_new_first() -> None:
    """The next generation keeps earlier items after the new ones; tool use adds up."""
    first = summarize_offline(material("alpha"), "", "en", 6000)
    second = summarize_offline(material("beta"), first, "en", 6000)
    sections = parse_sections(second, "en")
    assert sections[1][0].startswith("(user) Look up beta")
    assert any("alpha" in t for t in sections[1])
    assert sections[4][0].startswith('(tool: search_knowledge) ×6, latest: {"q": "beta"}')


def test_clamped_and_valid_under_small_target() -> None:
    """The body fits the target and keeps ≥ 3 sections, shrinking Done first."""
    big = material("y", 40)
    summarizer = OfflineSummarizer()
    outcome = summarizer.summarize(SummaryRequest(tuple(big), "", "en", 1200))
    assert len(outcome.body) <= 1200
    assert section_count(outcome.body) >= 3


def test_chinese_sections() -> None:
    """language zh uses the Chinese titles and 无 for empty sections."""
    body = summarize_offline([{"role": "user", "content": "帮我查一下退款政策"}], "", "zh", 3000)
    assert body.startswith("## 用户诉求\n无\n\n## 待办\n- (user) 帮我查一下退款政策")
    assert "## 走不通的路\n无" in body


def test_salience_prefers_facts_over_chit_chat() -> None:
    """Names, numbers and first-person facts outrank greetings; metadata tags don't count."""
    from ragent_memory.summary.offline import salience

    fact = "I moved to Lisbon in March 2021 to work for Acme Robotics."
    assert salience(fact) > salience("Hey Mel! Good to see you!")
    assert salience("[session 9 · 8 May, 2023] Caroline: Hey Mel!") < 2.0
    assert salience(f"(user) Caroline: {fact}") == salience(fact)


def test_salient_findings_survive_later_generations() -> None:
    """An early salient fact outlives later chit-chat across generations."""
    first = [{"role": "user", "content": "I moved to Lisbon in March 2021 to work for Acme."}]
    body = summarize_offline(first, "", "en", 1500)
    for i in range(8):
        chatter = [
            {"role": "user", "content": f"Haha that is so nice, really nice day {i}!"},
            {"role": "assistant", "content": "Glad to hear it, lovely indeed."},
        ]
        body = summarize_offline(chatter, body, "en", 1500)
    assert any("Lisbon" in item for item in parse_sections(body, "en")[4])


def test_small_talk_weighs_nothing() -> None:
    """Greetings and pleasantries score 0 and make neither findings nor to-dos."""
    from ragent_memory.summary.offline import is_small_talk, salience

    for chatter in ("Hey Mel! Good to see you!", "Thanks so much, that's awesome!", "Bye!"):
        assert is_small_talk(chatter) and salience(chatter) == 0.0
    assert not is_small_talk("Painting is fun.")
    assert not is_small_talk("I adopted 2 cats.")
    chat = [{"role": "user", "content": "Hi Mel! Let's catch up soon, thanks so much!"}]
    items = parse_sections(summarize_offline(chat, "", "en", 3000), "en")
    assert items[1] == [] and items[4] == []


def test_event_keeps_its_session_date() -> None:
    """A date in a session's first message applies to that session's later sentences."""
    chat = [
        {"role": "user", "content": "[7:30 pm on 21 November, 2023] Caroline: Hey Mel!"},
        {"role": "assistant", "content": "Melanie: I ran a charity race for Oxfam last Sunday."},
        {"role": "user", "content": "[session 2 · 8 May, 2024] Caroline: Hi!"},
        {"role": "user", "content": "I moved to Lisbon with my 2 kids."},
    ]
    findings = parse_sections(summarize_offline(chat, "", "en", 3000), "en")[4]
    race = [f for f in findings if "Oxfam" in f]
    lisbon = [f for f in findings if "Lisbon" in f]
    assert race == [
        "(assistant) [7:30 pm on 21 November, 2023] Melanie: I ran a charity race "
        "for Oxfam last Sunday."
    ]
    assert lisbon == ["(user) [8 May, 2024] I moved to Lisbon with my 2 kids."]


def test_chat_space_goes_to_findings() -> None:
    """Under a tight target a chat keeps its many findings rather than its few to-dos."""
    chat = [
        {
            "role": "user",
            "content": f"I need you to remember the blue folder {i}, the snacks for"
            " the kids, the dog food and the tickets for the long trip next week, please.",
        }
        for i in range(6)
    ]
    for i in range(30):
        chat.append({"role": "assistant", "content": f"Mel: I painted {i} sunsets at Lake Tahoe."})
    body = summarize_offline(chat, "", "en", 1500)
    items = parse_sections(body, "en")
    assert len(body) <= 1500
    assert len(items[4]) >= 3 * (len(items[0]) + len(items[1]))


def test_older_findings_merged_not_pushed_out() -> None:
    """A generation full of new salient findings keeps the best of the older ones too."""
    old = [
        {"role": "user", "content": f"I met Dr Rossi {i} times in Rome in 2019."} for i in range(10)
    ]
    body = summarize_offline(old, "", "en", 2000)
    new = [
        {"role": "user", "content": f"I flew 3000 km to Oslo on 12 June 2024 with Karl {i}."}
        for i in range(40)
    ]
    body = summarize_offline(new, body, "en", 2000)
    findings = parse_sections(body, "en")[4]
    assert any("Rossi" in f for f in findings) and any("Oslo" in f for f in findings)
    assert sum("Rossi" in f for f in findings) * 3 >= sum("Oslo" in f for f in findings)
