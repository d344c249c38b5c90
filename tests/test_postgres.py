"""What only the PostgreSQL store has: credentials from the environment, many hosts on one
database (DESIGN §10 "Many hosts")."""

from __future__ import annotations

import pytest
from conftest import PASSWORD_ENV
from pg_server import PASSWORD

from ragent_memory import ConfigError, MemoryEngine, Settings, StoreError, StoreSettings


def test_the_password_is_read_from_the_named_variable(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unset variable is a ConfigError naming store.password_env."""
    monkeypatch.delenv(PASSWORD_ENV)
    settings = Settings(store=StoreSettings(url=pg_url, password_env=PASSWORD_ENV))
    with pytest.raises(ConfigError, match=f"store.password_env.*{PASSWORD_ENV}"):
        MemoryEngine(settings)


def test_a_refused_login_never_shows_the_password(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong password is a StoreError naming the URL, without the password in it."""
    wrong = PASSWORD + "-wrong"
    monkeypatch.setenv(PASSWORD_ENV, wrong)
    settings = Settings(store=StoreSettings(url=pg_url, password_env=PASSWORD_ENV))
    with pytest.raises(StoreError) as info:
        MemoryEngine(settings)
    assert pg_url in str(info.value) and "password authentication failed" in str(info.value)
    assert wrong not in str(info.value) and PASSWORD not in str(info.value)
