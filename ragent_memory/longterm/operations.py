"""Operations on a user's facts (docs/design.md §9): read strictly from a model's JSON reply and
applied to the active facts as drafts."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from ragent_memory.core.logs import get_logger
from ragent_memory.core.records import Draft, Fact
from ragent_memory.errors import ExtractionError
from ragent_memory.longterm.vocabulary import (
    Add,
    Merge,
    Noop,
    Operation,
    Retract,
    Supersede,
    clean,
    normalised,
)
from ragent_memory.settings import MEMORY_ITEM_MAX_CHARS

log = get_logger(__name__)

_NEW: Final = 1 << 53  # new drafts sort after every stored fact (by id)
_OPS: Final = ("ADD", "SUPERSEDE", "RETRACT", "NOOP")
_WORD = re.compile(r"[^\W_]")
_FENCED = re.compile(r"^```[\w-]*[ \t]*\n(.*?)\n?```$", re.DOTALL)


@attrs.frozen
class Parsed:
    operations: tuple[Operation, ...]
    rejected: int  # items over the 500-char limit, or about a fact that is not shown


def _items(text: str, nonce: str | None, key: str) -> list[Any]:
    """The list under ``key`` of a JSON reply (or the bare list), fenced or not."""
    text = text.strip()
    if nonce and nonce.lower() in text.lower():
        raise ExtractionError("the reply echoes the fence nonce")
    fenced = _FENCED.match(text)
    if fenced is not None:
        text = fenced.group(1)
    try:
        data = json.loads(text)
    except ValueError as err:
        raise ExtractionError(f"the reply is not JSON: {err}") from err
    if isinstance(data, Mapping):
        data = data.get(key)
    if not isinstance(data, list):
        raise ExtractionError(f'expected {{"{key}": [...]}}')
    return data


def _number(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    raise ExtractionError(f"{where}.id must be a fact number, got {value!r}")


def _content(item: Mapping[str, Any], where: str) -> str:
    content = item.get("content")
    if not isinstance(content, str) or not content.strip():
        raise ExtractionError(f"{where}.content must be a non-empty string")
    return content


def _operation(item: Any, where: str, facts: Sequence[Fact], known: set[str]) -> Operation | None:
    """One item of a reply as an operation; ``None`` when it is rejected (logged)."""
    if not isinstance(item, Mapping):
        raise ExtractionError(f"{where} is not an object")
    op = item.get("op")
    if not isinstance(op, str) or op.strip().upper() not in _OPS:
        raise ExtractionError(f"{where}.op must be one of {', '.join(_OPS)}, got {op!r}")
    op = op.strip().upper()
    if op == "NOOP":
        return Noop()
    fact = None
    if op in ("SUPERSEDE", "RETRACT"):
        number = _number(item.get("id"), where)
        if not 1 <= number <= len(facts):
            log.warning("memory.unknown_fact", op=op, id=number, facts=len(facts))
            return None
        fact = facts[number - 1]
        if op == "RETRACT":
            return Retract(fact.id)
    content = clean(_content(item, where))
    if len(content) > MEMORY_ITEM_MAX_CHARS or not _WORD.search(content):
        log.warning("memory.item_rejected", op=op, chars=len(content))
        return None
    if normalised(content) in known:
        return Noop()
    return Add(content) if fact is None else Supersede(fact.id, content)


def parse_operations(text: str, facts: Sequence[Fact], *, nonce: str | None = None) -> Parsed:
    """Operations from a model reply, strictly (``id``: the fact's 1-based prompt number). A
    malformed reply raises ``ExtractionError``; an item over 500 chars, with no word, or about a
    number not shown is rejected alone, logged; a known wording is a ``NOOP``."""
    known = {normalised(f.content) for f in facts}
    items = _items(text, nonce, "operations")
    read = [_operation(item, f"operations[{i}]", facts, known) for i, item in enumerate(items)]
    operations = tuple(op for op in read if op is not None)
    return Parsed(operations, len(read) - len(operations))


def parse_merges(text: str, drafts: Sequence[Draft], *, nonce: str | None = None) -> list[Merge]:
    """Merges from a consolidation reply, strictly (``from`` holds prompt numbers)."""
    merges: list[Merge] = []
    used: set[int] = set()
    for index, item in enumerate(_items(text, nonce, "merges")):
        where = f"merges[{index}]"
        if not isinstance(item, Mapping):
            raise ExtractionError(f"{where} is not an object")
        content, numbers = _content(item, where), item.get("from")
        if not isinstance(numbers, list) or not numbers:
            raise ExtractionError(f"{where}.from must be a non-empty list of fact numbers")
        picked = [_number(n, f"{where}.from") for n in numbers]
        if any(not 1 <= n <= len(drafts) or n in used for n in picked):
            raise ExtractionError(f"{where}.from names an unknown or already merged fact")
        used.update(picked)
        merges.append(Merge(content, tuple(drafts[n - 1].key for n in picked)))
    return merges


def apply_operations(
    facts: Sequence[Fact], operations: Sequence[Operation]
) -> tuple[list[Draft], frozenset[int], int, int]:
    """The drafts after ``operations``, in order, with the retracted ids and the counts of
    facts added and superseded. A duplicate of a live fact changes nothing."""
    drafts = {f.id: Draft(f.id, f.content, f.id) for f in facts}
    retracted: set[int] = set()
    keys = itertools.count(1)
    added = superseded = 0

    def add(content: str, replaces: frozenset[int]) -> None:
        number = next(keys)
        drafts[-number] = Draft(-number, content, _NEW + number, True, replaces)

    for operation in operations:
        if isinstance(operation, Retract):
            if operation.id in drafts:
                del drafts[operation.id]
                retracted.add(operation.id)
        elif isinstance(operation, Supersede) and operation.id in drafts:
            old = drafts[operation.id]
            if normalised(old.content) == normalised(operation.content):
                continue
            del drafts[operation.id]
            add(operation.content, old.sources)
            superseded += 1
        elif isinstance(operation, Add | Supersede):  # a Supersede of a fact already gone adds
            key = normalised(operation.content)
            if any(normalised(d.content) == key for d in drafts.values()):
                continue
            add(operation.content, frozenset())
            added += 1
    return list(drafts.values()), frozenset(retracted), added, superseded


def merge_drafts(drafts: Sequence[Draft], merges: Sequence[Merge]) -> tuple[list[Draft], int]:
    """The drafts with ``merges`` applied, oldest first, and how many were folded; a merge
    of unknown drafts or with bad content is skipped: consolidation never loses a fact."""
    by_key = {d.key: d for d in drafts}
    next_key = min([0, *by_key]) - 1
    merged = 0
    for merge in merges:
        keys = list(dict.fromkeys(merge.keys))
        content = clean(merge.content)
        is_known = bool(keys) and all(k in by_key for k in keys)
        if not is_known or not 0 < len(content) <= MEMORY_ITEM_MAX_CHARS:
            continue
        parts = [by_key.pop(k) for k in keys]
        if len(parts) == 1 and parts[0].content == content:
            by_key[parts[0].key] = parts[0]
            continue
        order, is_touched = max(p.order for p in parts), any(p.is_touched for p in parts)
        sources = frozenset().union(*(p.sources for p in parts))
        by_key[next_key] = Draft(next_key, content, order, is_touched, sources)
        next_key -= 1
        merged += len(parts)
    return sorted(by_key.values(), key=lambda d: (d.order, d.key)), merged
