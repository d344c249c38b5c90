"""What each page of the audit page shows, read from the store: plain dicts for the templates,
no HTTP here. ``scope``, when set, is the one proxy scope whose sessions and users are shown."""

from __future__ import annotations

import bisect
import difflib
from collections.abc import Sequence
from typing import Any, Final, Protocol

import attrs

from ragent_memory.audit import GenerationProbes, SessionProbes
from ragent_memory.audit.probes import probe_generation
from ragent_memory.core.memo import Memo
from ragent_memory.serve.identity import is_scope
from ragent_memory.settings import Settings
from ragent_memory.store import AuditLog, MemoryStore, RecallIndex, SessionStore, TurnLog

TURN_ROWS: Final = 200  # the newest turns listed under the chart (the chart draws them all)
DIFF_LINES: Final = 400
GENERATIONS_KEPT: Final = 512  # generations whose probes a page keeps


class PageStore(SessionStore, TurnLog, AuditLog, RecallIndex, MemoryStore, Protocol):
    """What the pages read of a store (and ``forget_fact``, the one thing they change)."""


class NotFound(LookupError):
    """A session, message, user or fact this page does not show (absent, or another scope's)."""


def scope_of(identifier: str | None) -> str:
    """The proxy scope an id was written under ("" for an id the app gave directly)."""
    head, sep, _ = (identifier or "").partition(":")
    return head if sep and is_scope(head) else ""


class Pages:
    """The pages' data over ``store``. The probes of each generation are kept (bounded) until
    the recall index loses rows: a page opened again does not search again."""

    def __init__(self, store: PageStore, settings: Settings, scope: str | None = None) -> None:
        self.store = store
        self.settings = settings
        self.scope = scope
        self._probed: Memo[tuple[str, tuple[tuple[str, Any], ...]], GenerationProbes] = Memo(
            lambda key: probe_generation(store, settings, dict(key[1])),
            GENERATIONS_KEPT,
            lambda _key: 1,
        )

    def _check(self, identifier: str) -> None:
        if self.scope is not None and not identifier.startswith(f"{self.scope}:"):
            raise NotFound(identifier)

    def sessions(self, query: str = "") -> list[dict[str, Any]]:
        """The sessions, most recent first; those whose id or user holds ``query``."""
        wanted = query.strip().casefold()
        rows = []
        for row in self.store.session_list(self.scope):
            text = f"{row['session_id']} {row['user_id'] or ''}".casefold()
            if wanted in text:
                rows.append({**row, "scope": scope_of(row["session_id"])})
        return rows

    def session(self, session_id: str) -> dict[str, Any]:
        """The chart's turns, the turn table and every audit row with its summary's diff."""
        self._check(session_id)
        turns = self.store.turns(session_id)
        rows = self.store.compactions(session_id)
        if not turns and not rows and self.store.load_session(session_id) is None:
            raise NotFound(session_id)
        user_id = next((r["user_id"] for r in [*turns, *rows] if r["user_id"]), None)
        return {
            "session_id": session_id,
            "user_id": user_id,
            "scope": scope_of(session_id),
            "turns": turns,
            "recent": turns[-TURN_ROWS:][::-1],
            "generations": [{**row, "turns": _turns_of(row, turns)} for row in _with_diffs(rows)],
        }

    def probes(self, session_id: str) -> SessionProbes:
        self._check(session_id)
        epoch = self.store.recall_mark()[1]  # replaced by every delete of index rows
        rows = [r for r in self.store.compactions(session_id) if r["status"] == "applied"]
        keys = [(epoch, tuple(sorted(row.items()))) for row in rows]
        return SessionProbes(session_id, tuple(self._probed.many(keys)))

    def message(self, session_id: str, position: int) -> dict[str, Any]:
        """One raw message of the session, as the recall index keeps it."""
        self._check(session_id)
        found = self.store.indexed_at(session_id, [position])
        if not found:
            raise NotFound(f"{session_id} #{position}")
        return attrs.asdict(found[0])

    def facts(self, user_id: str) -> list[dict[str, Any]]:
        """The user's facts, every status, each with the ids it superseded."""
        self._check(user_id)
        rows = self.store.memory_rows(user_id, kind="fact")
        if not rows:
            raise NotFound(user_id)
        replaced: dict[int, list[int]] = {}
        for row in rows:
            if row["superseded_by"] is not None:
                replaced.setdefault(row["superseded_by"], []).append(row["id"])
        return [{**row, "superseded": replaced.get(row["id"], [])} for row in rows][::-1]

    def fact(self, user_id: str, fact_id: int) -> dict[str, Any]:
        """One active fact of the user (what the forget step asks about)."""
        for row in self.facts(user_id):
            if row["id"] == fact_id and row["status"] == "active":
                return row
        raise NotFound(f"{user_id} fact {fact_id}")

    def forget(self, user_id: str, fact_id: int) -> int:
        """Forget one active fact (and the versions it superseded); rows deleted."""
        self.fact(user_id, fact_id)
        return self.store.forget_fact(user_id, fact_id)


def _with_diffs(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each audit row, the applied ones with the diff of their summary against the previous
    applied one (lines tagged add / remove / same)."""
    previous = ""
    out = []
    for row in rows:
        diff: list[tuple[str, str]] = []
        if row["status"] == "applied":
            summary = row["summary"] or ""
            diff = _diff(previous, summary)
            previous = summary
        out.append({**row, "diff": diff})
    return out


def _diff(before: str, after: str) -> list[tuple[str, str]]:
    lines = difflib.ndiff(before.splitlines(), after.splitlines())
    tags = {"+": "add", "-": "remove", " ": "same"}
    diff = [(tags[line[0]], line[2:]) for line in lines if line[:1] in tags]
    return diff[:DIFF_LINES]


def _turns_of(row: dict[str, Any], turns: Sequence[dict[str, Any]]) -> tuple[int, int] | None:
    """The recorded turns whose new messages a generation covered: the first turn whose
    history reached past ``covered_from`` to the first that reached ``covered_to``."""
    start, stop = row.get("covered_from") or 0, row.get("covered_to") or 0
    if stop <= start or not turns:
        return None
    counts = [t["messages"] for t in turns]
    first = bisect.bisect_right(counts, start)
    last = bisect.bisect_left(counts, stop)
    if first >= len(turns) or last >= len(turns):
        return None
    return turns[first]["turn"], turns[last]["turn"]
