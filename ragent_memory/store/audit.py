"""The audit (docs/design.md §10): the append-only ``compactions`` table."""

from __future__ import annotations

from typing import Any, cast

import attrs

from ragent_memory.core.records import AuditRow
from ragent_memory.errors import StoreError
from ragent_memory.store.base import StoreBase, iso
from ragent_memory.store.schema import COMPACTION_COLUMNS


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
    cursor = db.execute(
        f"INSERT INTO compactions ({', '.join(record)}) VALUES ({', '.join('?' * len(record))})"
        " RETURNING id",
        list(record.values()),
    )
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
        sql = f"SELECT {', '.join(COMPACTION_COLUMNS)} FROM compactions WHERE 1 = 1"
        params: list[Any] = []
        if session_id is not None:
            sql += " AND session_id = ?"
            params.append(session_id)
        if scope is not None:
            sql += " AND substr(session_id, 1, ?) = ?"
            params += [len(scope) + 1, f"{scope}:"]
        rows = self._fetch(sql + " ORDER BY id", params)
        return [dict(zip(COMPACTION_COLUMNS, r, strict=True)) for r in rows]
