"""The offline summarizer on technical chats: long replies full of code and markdown, where a
later question needs the names, versions, numbers, decisions and changed values, the user's
own statements first."""

from __future__ import annotations

from typing import Any

from ragent_memory.summary.facts import prose, supersede, technical_weight
from ragent_memory.summary.offline import parse_sections, rank, salience, summarize_offline
from ragent_memory.summary.prompt import build_prompt

FINDINGS = 4
CODE = """```javascript
const io = require('socket.io')(server, { cors: { origin: '*' } });
server.listen(3000, () => { console.log('Server listening on port 3000'); });
```"""
REPLY = f"""Your setup looks solid. Here are some suggestions:

### 1. Error Handling
Add an `error` listener on the **server** object.

{CODE}

### 2. Scaling
- We decided to move sessions to Redis 7.2 with a 3600-second TTL.
- Keep Socket.io v4.6.1; upgrading to v4.7.2 changes the reconnection defaults.

Let me know if you need further assistance!"""


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def findings(body: str) -> list[str]:
    return parse_sections(body, "en")[FINDINGS]


def test_prose_drops_code_blocks_headings_and_markup() -> None:
    """Fenced code, headings and emphasis go; list items stand alone without their markers."""
    text = prose(REPLY)
    assert "require(" not in text and "console.log" not in text and "###" not in text
    assert "**" not in text and "`" not in text
    assert "We decided to move sessions to Redis 7.2 with a 3600-second TTL." in text.splitlines()
    assert "Plain words stay as they are." == prose("Plain words stay as they are.")


def test_a_long_reply_keeps_its_versions_and_decisions_not_its_code() -> None:
    """From a reply of code and headings the summary keeps the decision and the versions, and
    no line of code, heading or courtesy."""
    material = [user("[January 5, 2024] How should I scale my chat server?"), assistant(REPLY)]
    body = summarize_offline(material, "", "en", 1_400)
    items = "\n".join(findings(body))
    assert "Redis 7.2" in items and "3600-second TTL" in items
    assert "v4.6.1" in items and "v4.7.2" in items
    assert "require(" not in body and "###" not in body and "listen(3000" not in body
    assert "Let me know" not in body


def test_the_users_statements_come_first_under_findings() -> None:
    """The user's statements about their project lead the findings, ahead of the assistant's
    sentences as rich; a user's instruction gets no such weight (the engine quotes it)."""
    material = [
        user("I've set up Node.js v18.15.0 with Express v4.18.2 on port 3000 for my app."),
        assistant("Node.js v18.15.0 with Express v4.18.2 on port 3000 serves 2,000 users."),
        user("My deadline for the initial deployment is March 1, 2024."),
        assistant("The initial deployment deadline of March 1, 2024 leaves 5 weeks."),
    ]
    items = findings(summarize_offline(material, "", "en", 1_400))
    for word in ("Node.js", "March 1"):
        tags = [item.split(")")[0] + ")" for item in items if word in item]
        assert ["(user)", "(assistant)"] == tags, items
    assert rank("(user) Deploy 3 containers by March 1, 2024.") == salience(
        "(assistant) Deploy 3 containers by March 1, 2024."
    )


def test_a_changed_value_is_shown_as_the_latest_with_what_it_changed_from() -> None:
    """The previous summary's value of a thing is replaced by the newer one, the old value
    noted beside it; statements of other things stay."""
    first = [
        user("[March 2, 2024] My Redis instance uses 150MB of memory and holds 10,000 keys."),
        user("My login API answers in 120ms under 20 concurrent requests."),
    ]
    previous = summarize_offline(first, "", "en", 1_400)
    later = [
        user("[April 9, 2024] My Redis instance now uses 200MB of memory and holds 15,000 keys.")
    ]
    items = findings(summarize_offline(later, previous, "en", 1_400))
    redis = [item for item in items if "Redis" in item]
    assert 1 == len(redis), items
    assert "200MB" in redis[0] and "15,000 keys" in redis[0]
    assert redis[0].endswith("(before: 150MB, 10,000 keys)")
    assert any("120ms" in item for item in items)


def test_supersede_leaves_statements_without_values_and_other_topics_alone() -> None:
    """Only an older statement of the same topic with other values is superseded: a dated
    event without numbers and a different topic are both kept."""
    newer = ["(user) [June 1] I went to the lake with my kids and we swam."]
    older = ["(user) [May 8] I went to the lake with my kids and we fished.", "(user) Budget 4 GB."]
    assert (newer, older) == supersede(newer, older)


def test_versions_decisions_and_changes_weigh_more() -> None:
    """A sentence with a version, a decision or a from→to change outweighs plain prose."""
    assert 0 == technical_weight("The weather was nice on the way to the office.")
    assert technical_weight("We switched from MongoDB 6.0 to PostgreSQL 15.4.") >= 5


def test_the_model_prompt_asks_for_versions_changes_and_the_user_first() -> None:
    """The summary prompt asks for exact names, versions, numbers and decisions, a changed
    value as old → new, and the user's statements first under findings."""
    system = build_prompt("t", "", nonce="n", language="en", max_chars=1_000)[0]["content"]
    assert "versions, numbers, dates and decisions" in system
    assert "150MB → 200MB" in system
    assert "what the user stated about themselves and their project comes first" in system
    zh = build_prompt("t", "", nonce="n", language="zh", max_chars=1_000)[0]["content"]
    assert "版本号" in zh and "150MB → 200MB" in zh
