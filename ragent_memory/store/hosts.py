"""Many hosts on one store (docs/design.md §10): each store instance is a host with its own id.

``compaction_leases``: one compaction per session at a time across hosts. A lease is taken
when the compaction starts running (never while it waits in the pool's queue) and given back
when it ends; it names its holder (machine, process id, process start) and the holder renews
it every third of ``lease_s`` while the work runs. It lapses at once when its holder is gone:
on the same machine, when that process is dead or its id now belongs to a newer process; from
another machine, when it went ``lease_s`` without a renewal. A PostgreSQL advisory lock that
ends with its session is the model: a crash must not stall a session's compactions.

``session_writes``: which host wrote a session last (and a counter), so a host that cached a
session notices when another host has moved it on and reloads it.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections.abc import Callable
from contextlib import suppress
from datetime import timedelta
from pathlib import Path

import attrs

from ragent_memory.core.logs import get_logger
from ragent_memory.errors import StoreError
from ragent_memory.store.base import Sql, StoreBase, id_key, iso

log = get_logger(__name__)


LAST_WRITE = Sql(
    "SELECT writer, stamp FROM session_writes WHERE session_key = ?",
    "SELECT writer, stamp FROM session_writes WHERE session_key = %s",
)

WRITE_MARKED = Sql(
    "INSERT INTO session_writes (session_key, writer, stamp) VALUES (?, ?, 1) ON CONFLICT"
    " (session_key) DO UPDATE SET writer = excluded.writer, stamp = session_writes.stamp"
    " + 1",
    "INSERT INTO session_writes (session_key, writer, stamp) VALUES (%s, %s, 1) ON"
    " CONFLICT (session_key) DO UPDATE SET writer = excluded.writer, stamp ="
    " session_writes.stamp + 1",
)

LEASE_TAKEN = Sql(
    "INSERT INTO compaction_leases (session_key, owner, host, pid, started, expires_at)"
    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session_key) DO UPDATE SET owner ="
    " excluded.owner, host = excluded.host, pid = excluded.pid, started ="
    " excluded.started, expires_at = excluded.expires_at",
    "INSERT INTO compaction_leases (session_key, owner, host, pid, started, expires_at)"
    " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (session_key) DO UPDATE SET owner ="
    " excluded.owner, host = excluded.host, pid = excluded.pid, started ="
    " excluded.started, expires_at = excluded.expires_at",
)

LEASES_RENEWED = Sql(
    "UPDATE compaction_leases SET expires_at = ? WHERE owner = ?",
    "UPDATE compaction_leases SET expires_at = %s WHERE owner = %s",
)

LEASE_RELEASED = Sql(
    "DELETE FROM compaction_leases WHERE session_key = ? AND owner = ?",
    "DELETE FROM compaction_leases WHERE session_key = %s AND owner = %s",
)

LEASE_HELD = Sql(
    "SELECT owner, host, pid, started, expires_at FROM compaction_leases WHERE session_key = ?",
    "SELECT owner, host, pid, started, expires_at FROM compaction_leases WHERE session_key = %s",
)


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _machine() -> str:
    """This machine as its processes see it: host name, boot, PID namespace (a container
    with the same host name has its own process ids)."""
    with suppress(OSError):
        namespace = os.readlink("/proc/self/ns/pid")
        return f"{socket.gethostname()}/{_read('/proc/sys/kernel/random/boot_id')}/{namespace}"
    return socket.gethostname()


def _started(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot, Linux), "" when unknown: with
    the id, it names the process even after the id is reused."""
    stat = _read(f"/proc/{pid}/stat")
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else ""


@attrs.frozen
class Holder:
    """Who holds a lease: a process on a machine."""

    machine: str
    pid: int
    started: str

    @classmethod
    def this_process(cls) -> Holder:
        return cls(_machine(), os.getpid(), _started(os.getpid()))

    def is_gone(self, here: Holder) -> bool:
        """Whether this holder is known to be gone, seen from ``here``: only a process on the
        same machine can be checked (another machine's holder is gone when it stops renewing)."""
        if self.machine != here.machine:
            return False
        if self.pid == here.pid:
            return self.started != here.started
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # alive, another user's
        return bool(self.started) and _started(self.pid) != self.started


class Renewer:
    """Renews the leases a host holds every ``period_s`` while it holds any, on a thread
    started with the first lease and stopped by ``stop``."""

    def __init__(self, renew: Callable[[], None], period_s: float) -> None:
        self._renew = renew
        self._period_s = period_s
        self._held: set[str] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, session_id: str) -> None:
        with self._lock:
            self._held.add(session_id)
            if self._thread is None and not self._stopped.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="ragent-lease-renewer", daemon=True
                )
                self._thread.start()

    def drop(self, session_id: str) -> None:
        with self._lock:
            self._held.discard(session_id)

    def _run(self) -> None:
        while not self._stopped.wait(self._period_s):
            with self._lock:
                held = bool(self._held)
            if held:
                try:
                    self._renew()
                except StoreError as err:  # retried next period; the lease may lapse meanwhile
                    log.error("compaction.lease_renewal_failed", error=repr(err))

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=self._period_s + 30)


class HostTables(StoreBase):
    host_id: str
    lease_s: float
    holder: Holder
    _renewer: Renewer

    def _start_host(self, lease_s: float, holder: Holder | None = None) -> None:
        self.host_id = secrets.token_hex(8)
        self.lease_s = lease_s
        self.holder = holder or Holder.this_process()
        self._renewer = Renewer(self._renew_leases, lease_s / 3)

    def _stop_host(self) -> None:
        self._renewer.stop()

    def claim_compaction(self, session_id: str) -> bool:
        """Take the session's compaction lease (renewed while held); False while another
        holder that is not gone holds one that has not lapsed."""
        now = self.clock()
        key = id_key(session_id)
        holder = self.holder
        with self._locked("lease"), self.db.atomic():
            if self._held_elsewhere(key, iso(now)):
                return False
            self.db.execute(
                LEASE_TAKEN,
                [key, self.host_id, holder.machine, holder.pid, holder.started, self._expiry()],
            )
        self._renewer.hold(session_id)
        return True

    def compaction_leased(self, session_id: str) -> bool:
        """Whether another holder, not gone, holds the session's lease (a read: nothing is
        taken)."""
        with self._locked("lease"):
            return self._held_elsewhere(id_key(session_id), iso(self.clock()))

    def _held_elsewhere(self, key: bytes, now: str) -> bool:
        row = self.db.execute(
            LEASE_HELD,
            [key],
        ).fetchone()
        if row is None or row[0] == self.host_id or row[4] <= now:
            return False
        return not Holder(row[1], int(row[2]), row[3]).is_gone(self.holder)

    def _expiry(self) -> str:
        return iso(self.clock() + timedelta(seconds=self.lease_s))

    def _renew_leases(self) -> None:
        """Move on the expiry of every lease this host holds."""
        with self._locked("lease renewal"), self.db.atomic():
            self.db.execute(
                LEASES_RENEWED,
                [self._expiry(), self.host_id],
            )

    def release_compaction(self, session_id: str) -> None:
        """Give the lease back (a no-op when another host has taken it since)."""
        self._renewer.drop(session_id)
        with self._locked("lease"), self.db.atomic():
            self.db.execute(
                LEASE_RELEASED,
                [id_key(session_id), self.host_id],
            )

    def last_write(self, session_id: str) -> tuple[str, int] | None:
        """``(host id, counter)`` of the session's latest write (None: never written)."""
        rows = self._read_now(LAST_WRITE, [id_key(session_id)])
        return (str(rows[0][0]), int(rows[0][1])) if rows else None

    def _mark_written(self, session_id: str) -> None:
        """Inside a write transaction: this host wrote the session."""
        self.db.execute(
            WRITE_MARKED,
            [id_key(session_id), self.host_id],
        )
