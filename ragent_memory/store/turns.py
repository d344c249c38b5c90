"""What each ``prepare`` of a session measured (the ``turns`` table), and the listing of the
store's sessions the audit page opens with. A session keeps its last ``TURNS_KEPT`` rows; its
rows go when it is dropped."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ragent_memory.store.base import Sql, StoreBase, id_key, iso, key_of

TURNS_KEPT: Final = 2_000  # rows kept per session, the newest
_PRUNE_EVERY: Final = 100  # older rows are deleted once every this many turns

TURN_COLUMNS: Final = (
    "messages",
    "chars_raw",
    "chars_in",
    "chars_out",
    "budget_chars",
    "trimmed",
    "truncated",
    "reclaimed_chars",
    "compacted",
    "skipped_reason",
    "generation",
    "covered",
    "dropped_turns",
    "recalled_chars",
    "memory_chars",
)


_RECORDED = (
    f"INSERT INTO turns (session_key, turn, user_key, {', '.join(TURN_COLUMNS)}, created_at)"
    " SELECT {0}, COALESCE(MAX(turn), 0) + 1, {0}, "
    + ", ".join(["{0}"] * len(TURN_COLUMNS))
    + ", {0} FROM turns WHERE session_key = {0} ON CONFLICT DO NOTHING RETURNING turn"
)
TURN_RECORDED = Sql(_RECORDED.format("?"), _RECORDED.format("%s"))
_TURNS = (
    f"SELECT t.turn, u.value, {', '.join('t.' + c for c in (*TURN_COLUMNS, 'created_at'))}"
    " FROM turns AS t LEFT JOIN ids AS u ON u.key = t.user_key WHERE t.session_key = "
)
TURNS_OF_SESSION = Sql(f"{_TURNS}? ORDER BY t.turn", f"{_TURNS}%s ORDER BY t.turn")
# The sessions ``session_list`` finds: (a read, what it counts: a grouped read) each, and those
# dropped; all of them, or of one scope (parameters: its prefix's length and the prefix).
_TURNS_SEEN = (
    "SELECT session_id, MAX(user_id), COUNT(*), MAX(created_at) FROM"
    " (SELECT s.value AS session_id, u.value AS user_id, t.created_at FROM turns AS t"
    " JOIN ids AS s ON s.key = t.session_key LEFT JOIN ids AS u ON u.key = t.user_key) AS t"
)
_APPLIED = (
    "SELECT session_id, MAX(user_id), SUM(CASE WHEN status = 'applied' THEN 1 ELSE 0 END),"
    " MAX(created_at) FROM compactions"
)
_SAVED = (
    "SELECT session_id, user_id, 0, updated_at FROM"
    " (SELECT s.value AS session_id, u.value AS user_id, x.updated_at FROM sessions AS x"
    " JOIN ids AS s ON s.key = x.session_key LEFT JOIN ids AS u ON u.key = x.user_key) AS x"
)
_DROPPED = (
    "SELECT session_id FROM (SELECT s.value AS session_id FROM dropped_sessions AS d"
    " JOIN ids AS s ON s.key = d.session_key) AS d"
)
_GROUPED = " GROUP BY session_id"
_SCOPE = " WHERE substr(session_id, 1, ?) = ?"
_SCOPE_PG = " WHERE substr(session_id, 1, %s) = %s"
SESSION_READS = (
    (Sql(_TURNS_SEEN + _GROUPED, _TURNS_SEEN + _GROUPED), "turns"),
    (Sql(_APPLIED + _GROUPED, _APPLIED + _GROUPED), "generations"),
    (Sql(_SAVED, _SAVED), ""),
)
DROPPED = Sql(_DROPPED, _DROPPED)
SCOPED_READS = (
    (
        (Sql(_TURNS_SEEN + _SCOPE + _GROUPED, _TURNS_SEEN + _SCOPE_PG + _GROUPED), "turns"),
        (Sql(_APPLIED + _SCOPE + _GROUPED, _APPLIED + _SCOPE_PG + _GROUPED), "generations"),
        (Sql(_SAVED + _SCOPE, _SAVED + _SCOPE_PG), ""),
    ),
    Sql(_DROPPED + _SCOPE, _DROPPED + _SCOPE_PG),
)
TURNS_DELETED = Sql(
    "DELETE FROM turns WHERE session_key = ? AND turn <= ?",
    "DELETE FROM turns WHERE session_key = %s AND turn <= %s",
)


class TurnTables(StoreBase):
    def record_turn(
        self, session_id: str, fields: Mapping[str, Any], user_id: str | None = None
    ) -> int:
        """Append the session's next turn (``fields``: ``TURN_COLUMNS``); returns its number.
        Every ``_PRUNE_EVERY`` turns, the rows older than the last ``TURNS_KEPT`` go."""
        values = [int(v) if isinstance(v, bool) else v for v in (fields[c] for c in TURN_COLUMNS)]
        key = id_key(session_id)
        with self._locked("turn write"), self.db.atomic():
            self._keep_ids(session_id, user_id)
            rows = self.db.execute(
                TURN_RECORDED, [key, key_of(user_id), *values, iso(self.clock()), key]
            ).fetchall()
            turn = int(rows[0][0]) if rows else 0
            if turn and turn % _PRUNE_EVERY == 0:
                self.db.execute(
                    TURNS_DELETED,
                    [key, turn - TURNS_KEPT],
                )
        return turn

    def turns(self, session_id: str) -> list[dict[str, Any]]:
        """The session's recorded turns, oldest first."""
        columns = ("turn", *TURN_COLUMNS, "created_at")
        rows = self._fetch(TURNS_OF_SESSION, [id_key(session_id)])
        return [
            {"turn": row[0], "user_id": row[1], **dict(zip(columns[1:], row[2:], strict=True))}
            for row in rows
        ]

    def session_list(self, scope: str | None = None) -> list[dict[str, Any]]:
        """Every session the store knows (a summary state, recorded turns or audit rows), of
        one proxy scope (``SCOPE:id``) when given: its user, turns recorded, generations
        applied, last activity and whether it was dropped; the most recent first."""
        reads, dropped_read = (SESSION_READS, DROPPED) if scope is None else SCOPED_READS
        params = [] if scope is None else [len(scope) + 1, f"{scope}:"]
        found: dict[str, dict[str, Any]] = {}
        for sql, counted in reads:
            for session_id, user_id, count, at in self._fetch(sql, params):
                row = found.setdefault(
                    session_id,
                    {"session_id": session_id, "user_id": None, "turns": 0, "generations": 0},
                )
                row["user_id"] = row["user_id"] or user_id
                if counted:
                    row[counted] = int(count or 0)
                row["last_activity"] = max(row.get("last_activity") or "", at or "")
        dropped = {r[0] for r in self._fetch(dropped_read, params)}
        for row in found.values():
            row["dropped"] = row["session_id"] in dropped
        return sorted(
            found.values(), key=lambda r: (r["last_activity"], r["session_id"]), reverse=True
        )
