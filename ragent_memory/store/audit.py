"""The audit (docs/design.md §10): the append-only ``compactions`` table."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, cast

import attrs

from ragent_memory.core.records import AuditRow
from ragent_memory.errors import StoreError
from ragent_memory.store.base import Sql, StoreBase, iso
from ragent_memory.store.schema import COMPACTION_COLUMNS

# What an audit row writes: ``AuditRow``'s fields, then when.
_WRITTEN = (*(field.name for field in attrs.fields(AuditRow)), "created_at")
_MARKS = ", ".join(["?"] * len(_WRITTEN))
_MARKS_PG = ", ".join(["%s"] * len(_WRITTEN))
AUDITED = Sql(
    f"INSERT INTO compactions ({', '.join(_WRITTEN)}) VALUES ({_MARKS}) RETURNING id",
    f"INSERT INTO compactions ({', '.join(_WRITTEN)}) VALUES ({_MARKS_PG}) RETURNING id",
)
# The rows, oldest first: by (of one session, of one scope), the parameters in that order.
_READ = f"SELECT {', '.join(COMPACTION_COLUMNS)} FROM compactions WHERE 1 = 1"
_SESSION, _SESSION_PG = " AND session_id = ?", " AND session_id = %s"
_SCOPE, _SCOPE_PG = " AND substr(session_id, 1, ?) = ?", " AND substr(session_id, 1, %s) = %s"
_ORDER = " ORDER BY id"
AUDIT_READS = MappingProxyType(
    {
        (False, False): Sql(_READ + _ORDER, _READ + _ORDER),
        (True, False): Sql(_READ + _SESSION + _ORDER, _READ + _SESSION_PG + _ORDER),
        (False, True): Sql(_READ + _SCOPE + _ORDER, _READ + _SCOPE_PG + _ORDER),
        (True, True): Sql(
            _READ + _SESSION + _SCOPE + _ORDER, _READ + _SESSION_PG + _SCOPE_PG + _ORDER
        ),
    }
)


def audit_record(row: AuditRow, now: str) -> dict[str, Any]:
    """``row``'s columns, every one of them, stamped with ``created_at``."""
    # An untyped caller's loose dict could name any column: refused here, naming what it got.
    if not isinstance(cast(object, row), AuditRow):
        raise StoreError(f"an audit row is an AuditRow, not {type(row).__name__}")
    record = attrs.asdict(row)
    unknown = set(record) - set(COMPACTION_COLUMNS)
    if unknown:  # the record and the schema drifted apart
        raise StoreError(f"unknown compactions columns: {sorted(unknown)}")
    return {**record, "created_at": now}


def insert_audit(db: Any, record: dict[str, Any]) -> int:
    """Insert inside a transaction: ``RETURNING`` leaves sqlite-utils' autocommit aside."""
    cursor = db.execute(AUDITED, [record[name] for name in _WRITTEN])
    return int(cursor.fetchall()[0][0])


class AuditTable(StoreBase):
    def audit(self, row: AuditRow) -> int:
        """Append one row to ``compactions``; returns its id."""
        record = audit_record(row, iso(self.clock()))
        with self._locked("audit write"), self.db.atomic():
            return insert_audit(self.db, record)

    def compactions(
        self, session_id: str | None = None, *, scope: str | None = None
    ) -> list[dict[str, Any]]:
        """The rows, oldest first; of one session and/or one proxy scope (``SCOPE:id``)."""
        params: list[Any] = []
        if session_id is not None:
            params.append(session_id)
        if scope is not None:
            params += [len(scope) + 1, f"{scope}:"]
        rows = self._fetch(AUDIT_READS[session_id is not None, scope is not None], params)
        return [dict(zip(COMPACTION_COLUMNS, r, strict=True)) for r in rows]
