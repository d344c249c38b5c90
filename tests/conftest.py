"""Shared fixtures: settings on a real SQLite file (or a real PostgreSQL database), engines
that always close.

``backend`` picks the store: SQLite, or both SQLite and PostgreSQL for the tests marked
``both_backends`` that use a store. The PostgreSQL server is started once per run; each test
finds its database empty.
"""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI
from hypothesis import HealthCheck, settings
from pg_server import PASSWORD, PostgresUnavailable, postgres_server

from ragent_memory import Settings, StoreSettings
from ragent_memory.engine.memory_engine import MemoryEngine

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("deep", max_examples=1_000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "memory.db")


BACKENDS = ("sqlite", "postgres")
PASSWORD_ENV = "RAGENT_TEST_PG_PASSWORD"
_databases = itertools.count(1)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A PostgreSQL server for this run (its base URL); fails, never skips, without one."""
    try:
        with postgres_server() as url:
            yield url
    except PostgresUnavailable as err:
        pytest.fail(f"PostgreSQL is required for these tests: {err}", pytrace=False)


def admin(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, password=PASSWORD, autocommit=True)


@pytest.fixture
def fresh_pg_url(pg_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new, empty database; its password in the env var ``PASSWORD_ENV`` names."""
    name = f"t{os.getpid()}_{next(_databases)}"
    with admin(f"{pg_server}/postgres") as conn:
        conn.execute(f"CREATE DATABASE {name}")
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    return f"{pg_server}/{name}"


@pytest.fixture(scope="session")
def _shared_pg_url(pg_server: str) -> str:
    """One database for the run, migrated once (creating one per test costs ~0.3 s)."""
    from ragent_memory.store.postgres import PostgresStore

    url = f"{pg_server}/shared_{os.getpid()}"
    with admin(f"{pg_server}/postgres") as conn:
        conn.execute(f"CREATE DATABASE shared_{os.getpid()}")
    PostgresStore(url, password=PASSWORD).close()
    return url


@pytest.fixture
def pg_url(_shared_pg_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The shared database, emptied as a new store would find it (schema kept)."""
    with admin(_shared_pg_url) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                " AND tablename <> '_migrations'"
            )
        ]
        for table in tables:  # DELETE: far cheaper than TRUNCATE on tables this small
            conn.execute(f"DELETE FROM {table}")
        conn.execute("INSERT INTO meta (key, value) VALUES ('memory_seq', '0')")
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    return _shared_pg_url


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
        "both_backends"
    ):
        metafunc.parametrize("backend", BACKENDS, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture
def store_settings(backend: str, db_path: str, request: pytest.FixtureRequest) -> StoreSettings:
    if backend == "sqlite":
        return StoreSettings(path=db_path)
    return StoreSettings(url=request.getfixturevalue("pg_url"), password_env=PASSWORD_ENV)


@pytest.fixture
def make_settings(store_settings: StoreSettings) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        overrides.setdefault("store", store_settings)
        return Settings(**overrides)

    return make


@pytest.fixture
def make_engine(make_settings: Callable[..., Settings]) -> Iterator[Callable[..., MemoryEngine]]:
    engines: list[MemoryEngine] = []

    def make(settings: Settings | None = None, **kwargs: Any) -> MemoryEngine:
        engine = MemoryEngine(settings or make_settings(), **kwargs)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


@pytest.fixture
def closed_url() -> str:
    """A base URL nothing listens on (connection refused at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


@pytest.fixture(scope="module")
def upstream_server() -> Iterator[FakeOpenAI]:
    """A scripted OpenAI-compatible upstream on 127.0.0.1, one per test module."""
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def upstream(upstream_server: FakeOpenAI) -> FakeOpenAI:
    """The module's upstream with nothing recorded and nothing scripted yet."""
    upstream_server.reset()
    return upstream_server
