"""A throwaway PostgreSQL server for the tests: ``initdb`` in a temporary directory as an
unprivileged user, ``pg_ctl start`` on a free port, stopped (and deleted) at exit.

Never skips: when PostgreSQL cannot start, :class:`PostgresUnavailable` says why, and the
tests that need it fail with that message.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PG_BIN = Path(os.environ.get("RAGENT_PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_USER = "postgres"  # the unprivileged OS user the server runs as (root cannot)
PASSWORD = "tëst-sëcret-42"  # the role's password: the stores read it from an env var


class PostgresUnavailable(RuntimeError):
    """The test server could not be started."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_user(argv: list[str], user: str | None) -> list[str]:
    return ["runuser", "-u", user, "--", *argv] if user else argv


def _run(argv: list[str], user: str | None, what: str) -> None:
    try:
        done = subprocess.run(
            _as_user(argv, user), capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise PostgresUnavailable(f"{what} failed: {err}") from err
    if done.returncode != 0:
        raise PostgresUnavailable(f"{what} failed ({done.returncode}): {done.stderr.strip()}")


@contextmanager
def postgres_server() -> Iterator[str]:
    """Start a server; yields its base URL (user ``postgres``, no password in it)."""
    for tool in ("initdb", "pg_ctl"):
        if not (PG_BIN / tool).exists():
            raise PostgresUnavailable(
                f"{PG_BIN / tool} is missing: install PostgreSQL 15"
                " (apt-get install -y postgresql-15) or set RAGENT_PG_BIN"
            )
    user = PG_USER if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="ragent-pg-"))
    data, sockets = root / "data", root / "sock"
    sockets.mkdir()
    (root / "pw").write_text(PASSWORD + "\n", encoding="utf-8")
    if user:
        entry = pwd.getpwnam(user)
        for path in (root, sockets, root / "pw"):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    port = _free_port()
    started = False
    try:
        _run(
            [
                str(PG_BIN / "initdb"),
                "-D",
                str(data),
                "-U",
                PG_USER,
                "--pwfile",
                str(root / "pw"),
                "--auth=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ],
            user,
            "initdb",
        )
        options = (
            f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off"
            " -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        _run(
            [
                str(PG_BIN / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                options,
                "-l",
                str(root / "log"),
                "-w",
                "-t",
                "60",
                "start",
            ],
            user,
            "pg_ctl start",
        )
        started = True
        yield f"postgresql://{PG_USER}@127.0.0.1:{port}"
    finally:
        if started:
            subprocess.run(
                _as_user(
                    [str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], user
                ),
                capture_output=True,
                timeout=60,
                check=False,
            )
        shutil.rmtree(root, ignore_errors=True)
