"""Reduction (docs/design.md §8; Eino reduction): a tool result or tool-call input over the oversized
limit is shown as its head (20% of the limit), a notice with its size, recall ref and the recall
tool's name, and its tail (10%); arguments are wrapped as a JSON object so the call stays
parseable. Recall results are never reduced: reading an original back must not offload it
again (no offload → read → offload loop)."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs

from ragent_memory.core.chars import Message, text_of
from ragent_memory.recall.refs import RECALL_TOOL_NAME

HEAD_RATIO = 0.2
TAIL_RATIO = 0.1
ARGUMENTS_KEY = "truncated_arguments"

# ``offset`` is where the omitted part starts, so one call reads on from the head.
NOTICES = MappingProxyType(
    {
        "en": (
            "\n…[{omitted} of {n} chars omitted here; to read them call "
            '{tool}(ref="{ref}", offset={offset})]…\n'
        ),
        "zh": '\n…[此处省略 {omitted} 字符（原长 {n} 字符）；调用 {tool}(ref="{ref}", offset={offset}) 可继续读取]…\n',
    }
)


def preview(text: str, *, limit_chars: int, language: str, ref: str) -> str:
    """Head + notice + tail of ``text``."""
    head = int(limit_chars * HEAD_RATIO)
    tail = int(limit_chars * TAIL_RATIO)
    omitted = len(text) - head - tail
    notice = NOTICES[language].format(
        omitted=omitted, n=len(text), tool=RECALL_TOOL_NAME, ref=ref, offset=head
    )
    return text[:head] + notice + text[len(text) - tail :]


@attrs.frozen
class Preview:
    index: int  # position in the view
    replacement: Message
    refs: tuple[str, ...]
    offloaded: tuple[str, ...]  # the original texts behind ``refs``, in order


@attrs.frozen
class ReduceResult:
    messages: list[Message]
    previews: tuple[Preview, ...] = ()


def _call_name(view: Sequence[Message], index: int, call_id: Any) -> str | None:
    """The name of the call the tool result at ``index`` answers, searching outward from it
    (usually the message just before; after it in a history out of order); None if none."""
    for position in (*range(index - 1, -1, -1), *range(index + 1, len(view))):
        message = view[position]
        if message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or ():
            if call.get("id") == call_id:
                return (call.get("function") or {}).get("name")
    return None


def _with_text(message: Message, text: str) -> Message:
    """``message`` with its text replaced; non-text parts (images, files) are kept."""
    content = message.get("content")
    if not isinstance(content, list):
        return {**message, "content": text}
    others = [p for p in content if not (isinstance(p, Mapping) and p.get("type") == "text")]
    return {**message, "content": [{"type": "text", "text": text}, *others]}


def reduce(
    view: Sequence[Message],
    *,
    limit_chars: int,
    language: str,
    ref_for: Callable[[str], str],
    candidates: Collection[int] | None = None,
) -> ReduceResult:
    """Truncate oversized tool results and tool-call arguments in ``view`` (only at the
    indexes ``candidates`` when given: the engine passes the messages new since the last turn)."""
    indexes = range(len(view)) if candidates is None else sorted(candidates)
    out = list(view)
    done: list[Preview] = []
    for index in indexes:
        message = view[index]
        role = message.get("role")
        if role == "tool":
            text = text_of(message)
            if len(text) <= limit_chars:
                continue
            if _call_name(view, index, message.get("tool_call_id")) == RECALL_TOOL_NAME:
                continue  # a recall result is never reduced
            ref = ref_for(text)
            shown = preview(text, limit_chars=limit_chars, language=language, ref=ref)
            done.append(Preview(index, _with_text(message, shown), (ref,), (text,)))
        elif role == "assistant" and message.get("tool_calls"):
            calls, refs, texts = [], [], []
            for call in message["tool_calls"]:
                function = call.get("function") or {}
                arguments = function.get("arguments") or ""
                if len(arguments) <= limit_chars:
                    calls.append(call)
                    continue
                ref = ref_for(arguments)
                shown = preview(arguments, limit_chars=limit_chars, language=language, ref=ref)
                wrapped = json.dumps({ARGUMENTS_KEY: shown}, ensure_ascii=False)
                calls.append({**call, "function": {**function, "arguments": wrapped}})
                refs.append(ref)
                texts.append(arguments)
            if refs:
                replacement = {**message, "tool_calls": calls}
                done.append(Preview(index, replacement, tuple(refs), tuple(texts)))
    for item in done:
        out[item.index] = item.replacement
    return ReduceResult(out, tuple(done))
