"""Shared fixtures: settings on a real SQLite file, engines that always close."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from ragent_memory import Settings, StoreSettings
from ragent_memory.engine import MemoryEngine

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("deep", max_examples=1_000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "memory.db")


@pytest.fixture
def make_settings(db_path: str) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        overrides.setdefault("store", StoreSettings(path=db_path))
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
