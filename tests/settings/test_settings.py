"""Settings: the one knob, derived values, YAML loading and key-path errors."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from sessions import SHIPPED

from ragent_memory import ConfigError, Settings, load_settings
from ragent_memory.settings import settings_from_dict


def test_derived_values_at_default_budget() -> None:
    """B = 1,200,000 gives the numbers of the design table."""
    s = Settings(context_window_chars=1_200_000)
    assert (600_000, 960_000, 240_000, 6_000, 6_000) == (
        s.trim_trigger_chars,
        s.compact_trigger_chars,
        s.keep_recent_chars,
        s.summary_max_chars,
        s.memory_max_chars,
    )
    assert 4_500 == s.memory_consolidate_chars
    assert 50_000 == s.oversized_tool_result_chars


def test_derived_values_clamp_at_small_budget() -> None:
    """B = 20,000: summary 2,000 (10%), memory block clamped up to 1,500."""
    s = Settings(context_window_chars=20_000)
    assert 2_000 == s.summary_max_chars
    assert 1_500 == s.memory_max_chars
    assert 4_000 == s.oversized_tool_result_chars


def test_derived_values_are_read_only() -> None:
    """Derived values follow B and cannot be set."""
    s = Settings()
    with pytest.raises(AttributeError):
        s.trim_trigger_chars = 5  # type: ignore[misc]
    assert 50_000 == attrs.evolve(s, context_window_chars=100_000).trim_trigger_chars


def test_shipped_config_loads_with_defaults() -> None:
    """The shipped YAML documents the defaults and loads to them."""
    loaded = load_settings(SHIPPED)
    assert Settings() == loaded


@pytest.mark.parametrize(
    ("data", "key_path"),
    [
        ({"context_window_chars": 7_999}, "context_window_chars"),
        ({"context_window_chars": "big"}, "context_window_chars"),
        ({"context_window_chars": True}, "context_window_chars"),
        ({"contxt_window_chars": 10_000}, "contxt_window_chars"),
        ({"language": "fr"}, "language"),
        ({"summary_enabled": "yes"}, "summary_enabled"),
        ({"evictable_tools": "search_knowledge"}, "evictable_tools"),
        ({"store": {"path": ""}}, "store.path"),
        ({"store": {"file": "x.db"}}, "store.file"),
        ({"store": "x.db"}, "store"),
        ({"store": {"url": "mysql://db/agent"}}, "store.url"),
        ({"store": {"url": 5}}, "store.url"),
        ({"store": {"url": "postgresql://app:hunter2@db/agent"}}, "store.url"),
        ({"store": {"password_env": "PGPASSWORD"}}, "store.password_env"),
        (
            {"store": {"url": "postgresql://db/a", "password_env": "NOT A NAME"}},
            "store.password_env",
        ),
        ({"store": {"url": "postgresql://db/a", "path": "x.db"}}, "store"),
        ({"store": {"url": "postgresql://db/a", "pool_size": 0}}, "store.pool_size"),
        ({"store": {"url": "postgresql://db/a", "lease_s": 0}}, "store.lease_s"),
        ({"serve": {"identity": "token"}}, "serve.identity"),
        ({"serve": {"secret_env": "NOT A NAME"}}, "serve.secret_env"),
        ({"serve": {"allow_anonymous": "yes"}}, "serve.allow_anonymous"),
        ({"serve": {"trusted_proxies": "10.0.0.0/8"}}, "serve.trusted_proxies"),
        ({"serve": {"trusted_proxies": ["10.0.0.300"]}}, "serve.trusted_proxies"),
        ({"serve": {"trusted_proxies": [10]}}, "serve.trusted_proxies"),
        ({"serve": {"trusted_proxies": 5}}, "serve.trusted_proxies"),
        ({"serve": {"upstreams": {"gemini": "http://h/v1"}}}, "serve.upstreams"),
        ({"serve": {"upstreams": {"anthropic": "ftp://h"}}}, "serve.upstreams"),
        ({"serve": {"upstreams": ["http://h/v1"]}}, "serve.upstreams"),
        ({"serve": {"identity": "headers", "host": "0.0.0.0"}}, "serve.trusted_proxies"),
        ({"serve": {"identity": "headers", "host": "gateway.internal"}}, "serve.trusted_proxies"),
        ({"compaction_workers": 0}, "compaction_workers"),
        ({"recall_memory_mb": 0}, "recall_memory_mb"),
        ({"recall_memory_mb": "lots"}, "recall_memory_mb"),
        ({"compaction_timeout_s": -1}, "compaction_timeout_s"),
        ({"llm": {"model": "m"}}, "llm.base_url"),
        ({"llm": "http://x/v1"}, "llm"),
        ({"llm": {"base_url": "http://x/v1", "model": "m", "timeout_s": 0}}, "llm.timeout_s"),
        (
            {"llm": {"base_url": "http://x/v1", "model": "m", "api_key_env": "sk-123 456"}},
            "llm.api_key_env",
        ),
        (
            {"llm": {"base_url": "http://x/v1", "model": "m", "fallbacks": [{"base_url": "u"}]}},
            "llm.fallbacks[0].model",
        ),
        (
            {
                "llm": {
                    "base_url": "http://x/v1",
                    "model": "m",
                    "fallbacks": [{"base_url": "u", "model": "n", "colour": 1}],
                }
            },
            "llm.fallbacks[0].colour",
        ),
    ],
)
def test_config_errors_name_the_key_path(data: dict[str, object], key_path: str) -> None:
    """Unknown keys, wrong types and out-of-range values raise ConfigError naming the key."""
    with pytest.raises(ConfigError) as info:
        settings_from_dict(data)
    assert key_path == info.value.key_path
    assert str(info.value).startswith(key_path)
    assert isinstance(info.value, ValueError)


def test_llm_settings_list_endpoints_in_order() -> None:
    """The primary endpoint comes first, then the fallbacks."""
    s = settings_from_dict(
        {
            "llm": {
                "base_url": "http://a/v1",
                "model": "m1",
                "fallbacks": [{"base_url": "http://b/v1", "model": "m2", "api_key_env": "B_KEY"}],
            }
        }
    )
    assert s.llm is not None
    assert ["m1", "m2"] == [e.model for e in s.llm.endpoints]


def test_invalid_yaml_is_a_config_error(tmp_path: Path) -> None:
    """A YAML syntax error is reported as ConfigError, not a parser traceback."""
    path = tmp_path / "bad.yaml"
    path.write_text("context_window_chars: [1,\n")
    with pytest.raises(ConfigError):
        load_settings(path)


@pytest.mark.parametrize(
    ("kwargs", "key_path"),
    [
        ({"store": 5}, "store"),
        ({"store": {"pth": "x.db"}}, "store.pth"),
        ({"llm": {"model": "m"}}, "llm.base_url"),
        ({"llm": "http://x/v1"}, "llm"),
    ],
)
def test_settings_in_code_check_nested_types(kwargs: dict[str, object], key_path: str) -> None:
    """Settings(...) built in code rejects what is not a section, naming the key path."""
    with pytest.raises(ConfigError) as info:
        Settings(**kwargs)  # type: ignore[arg-type]
    assert key_path == info.value.key_path


def test_settings_in_code_accept_sections_as_mappings() -> None:
    """Nested sections may be given as in the YAML file, and the store as a bare path."""
    from ragent_memory import LLMSettings, StoreSettings

    assert StoreSettings(path="m.db") == Settings(store={"path": "m.db"}).store  # type: ignore[arg-type]
    assert StoreSettings(path="m.db") == Settings(store="m.db").store  # type: ignore[arg-type]
    llm = Settings(llm={"base_url": "http://x/v1", "model": "m"}).llm  # type: ignore[arg-type]
    assert LLMSettings(base_url="http://x/v1", model="m") == llm


@pytest.mark.parametrize(
    "serve",
    [
        {"identity": "headers"},
        {"identity": "headers", "host": "localhost"},
        {"identity": "headers", "host": "::1"},
        {"identity": "headers", "host": "0.0.0.0", "trusted_proxies": ("10.0.0.0/8", "::1")},
        {"identity": "credential", "host": "0.0.0.0", "allow_anonymous": True},
    ],
)
def test_serve_identity_keys_accept_what_they_document(serve: dict[str, object]) -> None:
    """Headers on loopback, or anywhere with trusted_proxies; proxies as addresses or CIDRs."""
    yaml_like = {k: list(v) if isinstance(v, tuple) else v for k, v in serve.items()}
    loaded = settings_from_dict({"serve": yaml_like}).serve
    assert serve == {key: getattr(loaded, key) for key in serve}


def test_serve_secret_is_read_from_the_named_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve.secret_env`` names a variable; unset or short is a ConfigError naming the key."""
    from ragent_memory.settings import ServeSettings

    assert ServeSettings().secret() is None
    section = ServeSettings(secret_env="RAGENT_TEST_SCOPE_SECRET")
    for value in (None, "short"):
        if value is None:
            monkeypatch.delenv("RAGENT_TEST_SCOPE_SECRET", raising=False)
        else:
            monkeypatch.setenv("RAGENT_TEST_SCOPE_SECRET", value)
        with pytest.raises(ConfigError) as info:
            section.secret()
        assert "serve.secret_env" == info.value.key_path
        assert value is None or value not in str(info.value)
    monkeypatch.setenv("RAGENT_TEST_SCOPE_SECRET", "k" * 16)
    assert b"k" * 16 == section.secret()


LLM = {"base_url": "http://x/v1", "model": "m"}
EMBEDDINGS = {"base_url": "http://x/v1", "model": "e"}


@pytest.mark.parametrize(
    ("data", "key_path", "bound"),
    [
        ({"offload_ttl_days": 3_000_000}, "offload_ttl_days", "<= 36500"),
        ({"offload_ttl_days": 0}, "offload_ttl_days", "> 0"),
        ({"compaction_timeout_s": 1e300}, "compaction_timeout_s", "<= 86400"),
        ({"context_window_chars": 10**12}, "context_window_chars", "8000..1000000000"),
        ({"session_cache_size": 10**9}, "session_cache_size", "1..10000000"),
        ({"recall_memory_mb": 10**9}, "recall_memory_mb", "1..1048576"),
        ({"max_id_chars": 8}, "max_id_chars", "32..1048576"),
        ({"max_id_chars": 10**7}, "max_id_chars", "32..1048576"),
        ({"store": {"url": "postgresql://db/a", "lease_s": 1e9}}, "store.lease_s", "<= 3600"),
        ({"store": {"url": "postgresql://db/a", "pool_size": 10**6}}, "store.pool_size", "1..1000"),
        ({"llm": {**LLM, "timeout_s": 1e12}}, "llm.timeout_s", "<= 86400"),
        ({"llm": {**LLM, "max_input_chars": 10**12}}, "llm.max_input_chars", "10000..1000000000"),
        (
            {"recall": {"embeddings": {**EMBEDDINGS, "timeout_s": 1e12}}},
            "recall.embeddings.timeout_s",
            "<= 86400",
        ),
        ({"recall": {"max_chars": 10**12}}, "recall.max_chars", "0..1000000000"),
        ({"recall": {"turn_chars": 10**12}}, "recall.turn_chars", "0..1000000000"),
        ({"serve": {"timeout_s": 1e12}}, "serve.timeout_s", "<= 86400"),
        ({"serve": {"max_body_bytes": 1 << 40}}, "serve.max_body_bytes", "1024..2147483648"),
    ],
)
def test_numbers_past_their_bound_fail_at_load(
    data: dict[str, object], key_path: str, bound: str
) -> None:
    """A number past its key's bound (one that would overflow a date or a timeout later, on
    every turn) is a ConfigError at load naming the key path and the bound."""
    with pytest.raises(ConfigError) as info:
        settings_from_dict(data)
    assert key_path == info.value.key_path
    assert bound in str(info.value)


def test_the_longest_ttl_still_offloads(tmp_path: Path) -> None:
    """offload_ttl_days at its bound gives a date the store can write: a prepare that
    offloads succeeds (3,000,000 days failed every such prepare with OverflowError)."""
    from ragent_memory import MemoryEngine

    settings = settings_from_dict(
        {
            "context_window_chars": 8_000,
            "offload_ttl_days": 36_500,
            "store": {"path": str(tmp_path / "m.db")},
        }
    )
    result = "x" * 20_000
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": result},
    ]
    with MemoryEngine(settings) as engine:
        prepared = engine.prepare(messages, session_id="s")
    assert prepared.report.truncated == 1
