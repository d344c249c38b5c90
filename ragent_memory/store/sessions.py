"""Sessions (docs/design.md §5): each session's summary state and its sticky substitutions, shared by
every engine on the store; dropping a session."""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import MappingProxyType

import attrs

from ragent_memory.core.records import AuditRow, SessionState, Substitution
from ragent_memory.store.audit import audit_record, insert_audit
from ragent_memory.store.base import Sql, _json_text, id_key, iso, key_of
from ragent_memory.store.hosts import HostTables
from ragent_memory.store.offloads import OffloadTables

# The columns of ``sessions``, ``updated_at`` aside, are named after ``SessionState``'s fields,
# the ids aside: ``session_key`` and ``user_key`` stand for them (``ids`` has their text).
_KEYED = MappingProxyType({"session_id": "session_key", "user_id": "user_key"})
_COLUMNS = tuple(field.name for field in attrs.fields(SessionState) if field.name not in _KEYED)
# What a save writes: the keys, the state's other fields, when.
_WRITTEN = ("session_key", "user_key", *_COLUMNS, "updated_at")
_LOADED = (
    f"SELECT u.value, {', '.join('s.' + name for name in _COLUMNS)} FROM sessions AS s"
    " LEFT JOIN ids AS u ON u.key = s.user_key WHERE s.session_key = "
)
SESSION_LOADED = Sql(f"{_LOADED}?", f"{_LOADED}%s")
_SAVED = " ON CONFLICT (session_key) DO UPDATE SET " + ", ".join(
    f"{name} = excluded.{name}" for name in _WRITTEN[1:]
)
SESSION_SAVED = Sql(
    f"INSERT INTO sessions ({', '.join(_WRITTEN)}) VALUES ({', '.join(['?'] * len(_WRITTEN))})"
    + _SAVED,
    f"INSERT INTO sessions ({', '.join(_WRITTEN)}) VALUES ({', '.join(['%s'] * len(_WRITTEN))})"
    + _SAVED,
)
# What a drop deletes at once.
SESSION_ROWS_DELETED = tuple(
    Sql(f"DELETE FROM {table} WHERE session_key = ?", f"DELETE FROM {table} WHERE session_key = %s")
    for table in ("substitutions", "sessions", "turns")
)


SUBSTITUTIONS_OF_SESSION = Sql(
    "SELECT key, kind, ref, message FROM substitutions WHERE session_key = ?",
    "SELECT key, kind, ref, message FROM substitutions WHERE session_key = %s",
)

SUBSTITUTION_SAVED = Sql(
    "INSERT INTO substitutions (session_key, key, kind, ref, message, created_at) VALUES"
    " (?, ?, ?, ?, ?, ?) ON CONFLICT (session_key, key) DO UPDATE SET kind ="
    " excluded.kind, ref = excluded.ref, message = excluded.message, created_at ="
    " excluded.created_at",
    "INSERT INTO substitutions (session_key, key, kind, ref, message, created_at) VALUES"
    " (%s, %s, %s, %s, %s, %s) ON CONFLICT (session_key, key) DO UPDATE SET kind ="
    " excluded.kind, ref = excluded.ref, message = excluded.message, created_at ="
    " excluded.created_at",
)

SUBSTITUTION_DELETED = Sql(
    "DELETE FROM substitutions WHERE session_key = ? AND key = ?",
    "DELETE FROM substitutions WHERE session_key = %s AND key = %s",
)

SESSION_DROPPED = Sql(
    "INSERT INTO dropped_sessions (session_key, dropped_at) VALUES (?, ?) ON CONFLICT"
    " (session_key) DO UPDATE SET dropped_at = excluded.dropped_at",
    "INSERT INTO dropped_sessions (session_key, dropped_at) VALUES (%s, %s) ON CONFLICT"
    " (session_key) DO UPDATE SET dropped_at = excluded.dropped_at",
)

LAST_APPLIED_GENERATION = Sql(
    "SELECT MAX(generation) FROM compactions WHERE session_id = ? AND status = 'applied'",
    "SELECT MAX(generation) FROM compactions WHERE session_id = %s AND status = 'applied'",
)

IS_DROPPED = Sql(
    "SELECT 1 FROM dropped_sessions WHERE session_key = ?",
    "SELECT 1 FROM dropped_sessions WHERE session_key = %s",
)

GENERATIONS = Sql(
    "SELECT generation, last_generation FROM sessions WHERE session_key = ?",
    "SELECT generation, last_generation FROM sessions WHERE session_key = %s",
)


class SessionTables(OffloadTables, HostTables):
    def substitutions(self, session_id: str) -> dict[str, Substitution]:
        rows = self._fetch(
            SUBSTITUTIONS_OF_SESSION,
            [id_key(session_id)],
        )
        return {r[0]: Substitution(r[0], r[1], r[2], json.loads(r[3])) for r in rows}

    def save_substitutions(
        self,
        session_id: str,
        items: Sequence[tuple[Substitution, Sequence[str]]],
        *,
        ttl_days: float,
    ) -> None:
        """Record sticky replacements and offload their originals, in one transaction."""
        if not items:
            return
        now = iso(self.clock())
        with self._locked("write"), self.db.atomic():
            self._revive(session_id)
            self._mark_written(session_id)
            self._offload(
                session_id, [text for _, originals in items for text in originals], ttl_days
            )
            key = id_key(session_id)
            self.db.executemany(
                SUBSTITUTION_SAVED,
                [
                    [key, sub.key, sub.kind, sub.ref, _json_text(sub.message), now]
                    for sub, _ in items
                ],
            )

    def delete_substitutions(self, session_id: str, keys: Sequence[str]) -> None:
        """Remove sticky replacements (a turn's recall block leaving its message); what they
        offloaded, if anything, expires as usual."""
        if not keys:
            return
        with self._locked("write"), self.db.atomic():
            self._mark_written(session_id)
            key = id_key(session_id)
            self.db.executemany(
                SUBSTITUTION_DELETED,
                [[key, k] for k in keys],
            )

    def load_session(self, session_id: str) -> SessionState | None:
        rows = self._fetch(SESSION_LOADED, [id_key(session_id)])
        if not rows:
            return None
        fields = dict(zip(_COLUMNS, rows[0][1:], strict=True))
        for name in ("verbatim", "preserved"):
            fields[name] = tuple(json.loads(fields[name]))
        return SessionState(session_id=session_id, user_id=rows[0][0], **fields)

    def new_session(self, session_id: str) -> SessionState:
        """The state a session without a stored one starts from. A dropped id used again numbers
        its generations on from the audit's highest: a unique index on applied generations would
        refuse every compaction of a new life restarting at 1."""
        with self._locked("read"):
            return SessionState(session_id, last_generation=self._last_applied(session_id))

    def _last_applied(self, session_id: str) -> int:
        row = self.db.execute(  # the audit keeps the id as text
            LAST_APPLIED_GENERATION,
            [session_id],
        ).fetchone()
        return int(row[0] or 0)  # MAX: one row, NULL when none applied

    def save_session(self, state: SessionState) -> None:
        """Write a session's whole summary state in one transaction."""
        with self._locked("write"), self.db.atomic():
            self._write_session(state)

    def commit_generation(
        self, state: SessionState, previous: SessionState, audit: AuditRow | None = None
    ) -> bool:
        """Write ``state`` only if the stored session is still ``previous`` (same generations) and
        not dropped: False when a late compaction lost the race. ``audit``, the ``applied`` row,
        commits in the same transaction: a crash leaves both or neither (docs/design.md §10)."""
        record = audit_record(audit, iso(self.clock())) if audit is not None else None
        with self._locked("write"), self.db.atomic():
            key = id_key(state.session_id)
            dropped = self.db.execute(IS_DROPPED, [key]).fetchone()
            row = self.db.execute(GENERATIONS, [key]).fetchone()
            current = tuple(row) if row is not None else (0, self._last_applied(state.session_id))
            if dropped is not None or current != (previous.generation, previous.last_generation):
                return False
            self._write_session(state)
            if record is not None:
                insert_audit(self.db, record)
            return True

    def _write_session(self, state: SessionState) -> None:
        self._mark_written(state.session_id)
        self._keep_ids(state.user_id)
        fields = attrs.asdict(state, recurse=False)
        fields["session_id"] = id_key(fields["session_id"])
        fields["user_id"] = key_of(fields["user_id"])
        fields = {_KEYED.get(name, name): value for name, value in fields.items()}
        for name in ("verbatim", "preserved"):
            fields[name] = json.dumps(list(fields[name]), ensure_ascii=False)
        fields["updated_at"] = iso(self.clock())
        self.db.execute(SESSION_SAVED, [fields[name] for name in _WRITTEN])

    def drop_session(self, session_id: str) -> None:
        """Drop a session: its summary state, substitutions and turns go now (so the id, used again,
        starts fresh), its refs stop resolving at once, and :meth:`gc` deletes its offloads.
        Audit rows stay."""
        with self._locked("write"), self.db.atomic():
            self._mark_written(session_id)
            key = id_key(session_id)
            for deleted in SESSION_ROWS_DELETED:
                self.db.execute(deleted, [key])
            self.db.execute(
                SESSION_DROPPED,
                [key, iso(self.clock())],
            )
