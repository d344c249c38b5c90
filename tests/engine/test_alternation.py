"""strict_alternation: engine-inserted messages merged so roles alternate where the input's did."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from sessions import rag_turn

from ragent_memory import MemoryEngine, Settings
from ragent_memory.core.alternation import alternate, join_content

# A Mistral-style template: after an optional system message, user and assistant turns must
# alternate (tool results and assistant tool calls are left out of the count, as Mistral's
# tool-calling template does). It raises like the ones vLLM and llama.cpp serve.
STRICT_TEMPLATE = """
{%- if messages[0].role == 'system' %}{% set rest = messages[1:] %}{% else %}{% set rest = messages %}{% endif %}
{%- set ns = namespace(index=0) %}
{%- for message in rest %}
  {%- if message.role == 'system' %}{{ raise_exception('system message after the start') }}{% endif %}
  {%- if message.role != 'tool' and not message.tool_calls %}
    {%- if (message.role == 'user') != (ns.index % 2 == 0) %}
      {{- raise_exception('roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- set ns.index = ns.index + 1 %}
  {%- endif %}
[{{ message.role }}]{% if message.content is string %} {{ message.content }}{% endif %}
{%- endfor %}
"""


class TemplateError(Exception):
    pass


def _raise(text: str) -> None:
    raise TemplateError(text)


def render(messages: list[dict[str, Any]]) -> str:
    env = ImmutableSandboxedEnvironment(undefined=jinja2.Undefined)
    env.globals["raise_exception"] = _raise
    return env.from_string(STRICT_TEMPLATE).render(messages=messages)


def user(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": text, **extra}


SYSTEM = {"role": "system", "content": "persona"}
ASSISTANT = {"role": "assistant", "content": "ok"}


@pytest.mark.parametrize(
    ("messages", "inserted", "expected"),
    [
        pytest.param(
            [SYSTEM, user("memory"), user("summary"), user("q", name="ann")],
            range(1, 3),
            [SYSTEM, user("memory\n\nsummary\n\nq", name="ann")],
            id="block+summary+first-user-one-message-with-the-callers-keys",
        ),
        pytest.param(
            [SYSTEM, user("memory"), ASSISTANT, user("q")],
            range(1, 2),
            [SYSTEM, user("memory"), ASSISTANT, user("q")],
            id="already-alternating-untouched",
        ),
        pytest.param(
            [SYSTEM, user("summary"), user("a"), user("b")],
            range(1, 2),
            [SYSTEM, user("summary\n\na"), user("b")],
            id="callers-own-adjacent-users-kept",
        ),
        pytest.param(
            [user("a"), user("memory")],
            range(1, 2),
            [user("a\n\nmemory")],
            id="inserted-after-a-caller-message",
        ),
        pytest.param([SYSTEM, user("q")], range(1, 1), [SYSTEM, user("q")], id="nothing-inserted"),
    ],
)
def test_alternate_merges_only_inserted_messages(
    messages: list[dict[str, Any]], inserted: range, expected: list[dict[str, Any]]
) -> None:
    """Inserted messages fold into same-role neighbours; the caller's adjacency is kept."""
    snapshot = [dict(m) for m in messages]
    assert expected == alternate(messages, inserted)
    assert snapshot == messages


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        ("a", "b", "a\n\nb"),
        ("a", None, "a"),
        ("", "b", "b"),
        (
            "a",
            [{"type": "image_url", "image_url": {"url": "x"}}],
            [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}],
        ),
    ],
)
def test_join_content_keeps_both_in_order(first: Any, second: Any, expected: Any) -> None:
    """Text joins with a blank line; any list of parts makes the result a list of parts."""
    assert expected == join_content(first, second)


def _session(turns: int, rng: random.Random) -> list[dict[str, Any]]:
    return [m for turn in range(turns) for m in rag_turn(turn, rng)]


FACTS = {3: "My name is Ada Lovelace.", 7: "I prefer short answers.", 11: "I live in Lisbon."}


def _drive(engine: MemoryEngine, turns: int, check: Callable[[list[dict[str, Any]]], None]) -> int:
    """Run a session with user facts; ``check`` every prepared context. Returns turns with a
    memory block and a summary both shown."""
    rng = random.Random(11)
    history: list[dict[str, Any]] = [SYSTEM]
    both = 0
    for turn in range(turns):
        first, *rest = rag_turn(turn, rng)
        if turn in FACTS:
            first = user(f"{FACTS[turn]} {first['content']}")
        history.append(first)
        prepared = engine.prepare(history, session_id="s1", user_id="u1")
        check(prepared.messages)
        both += prepared.report.memory_chars > 0 and prepared.report.generation > 0
        history.extend(rest)
        engine.after_turn(history, session_id="s1", user_id="u1")
        engine.flush()
    return both


@pytest.mark.slow
def test_strict_template_accepts_every_context_of_a_300_turn_session(
    make_settings: Callable[..., Settings],
) -> None:
    """With strict_alternation a template raising on non-alternation renders all 300 turns."""
    settings = make_settings(context_window_chars=12_000, strict_alternation=True)
    with MemoryEngine(settings) as engine:
        both = _drive(engine, 300, render)
    assert both > 100  # memory block and summary were really there to merge


def test_without_strict_alternation_the_template_rejects_the_context(
    make_settings: Callable[..., Settings],
) -> None:
    """The default output has consecutive user messages, which the strict template refuses."""
    settings = make_settings(context_window_chars=12_000)
    with MemoryEngine(settings) as engine, pytest.raises(TemplateError, match="alternate"):
        _drive(engine, 40, render)
