"""Many hosts on one store (DESIGN §10): each store instance is a host with its own id.
``compaction_leases``: one compaction per session at a time across hosts, claimed before the
summarizer call and released after the commit; a dead host's lease expires after ``lease_s``.
``session_writes``: which host wrote a session last (and a counter), so a host that cached a
session notices when another host has moved it on and reloads it."""

from __future__ import annotations

import secrets
from datetime import timedelta

from ragent_memory.store.base import StoreBase, iso


class HostTables(StoreBase):
    host_id: str
    lease_s: float

    def _start_host(self, lease_s: float) -> None:
        self.host_id = secrets.token_hex(8)
        self.lease_s = lease_s

    def claim_compaction(self, session_id: str) -> bool:
        """Take the session's compaction lease for ``lease_s``; False while another host
        holds an unexpired one."""
        now = self.clock()
        expires = iso(now + timedelta(seconds=self.lease_s))
        with self._locked("lease"), self.db.atomic():
            cursor = self.db.execute(
                "INSERT INTO compaction_leases (session_id, owner, expires_at) VALUES (?, ?, ?)"
                " ON CONFLICT (session_id) DO UPDATE SET owner = excluded.owner,"
                " expires_at = excluded.expires_at"
                " WHERE compaction_leases.expires_at <= ? OR compaction_leases.owner = ?",
                [session_id, self.host_id, expires, iso(now), self.host_id],
            )
            return int(cursor.rowcount) == 1

    def release_compaction(self, session_id: str) -> None:
        """Give the lease back (a no-op when another host has taken it since)."""
        with self._locked("lease"), self.db.atomic():
            self.db.execute(
                "DELETE FROM compaction_leases WHERE session_id = ? AND owner = ?",
                [session_id, self.host_id],
            )

    def last_write(self, session_id: str) -> tuple[str, int] | None:
        """``(host id, counter)`` of the session's latest write (None: never written)."""
        rows = self._read_now(
            "SELECT writer, stamp FROM session_writes WHERE session_id = ?", [session_id]
        )
        return (str(rows[0][0]), int(rows[0][1])) if rows else None

    def _mark_written(self, session_id: str) -> None:
        """Inside a write transaction: this host wrote the session."""
        self.db.execute(
            "INSERT INTO session_writes (session_id, writer, stamp) VALUES (?, ?, 1)"
            " ON CONFLICT (session_id) DO UPDATE SET writer = excluded.writer,"
            " stamp = session_writes.stamp + 1",
            [session_id, self.host_id],
        )
