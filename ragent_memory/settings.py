"""Settings: one knob, ``context_window_chars`` (B), and everything derived from it.
Defaults live on the fields (the YAML file only documents them). Derived values are read-only
properties so they can never drift from B. Every validation failure is a ``ConfigError`` whose
``key_path`` names the offending key, e.g. ``llm.fallbacks[1].model``."""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast
from urllib.parse import urlsplit

import attrs
import yaml

from ragent_memory.errors import ConfigError

MIN_CONTEXT_WINDOW_CHARS = 8_000

# Fixed constants of docs/design.md §1.
KEEP_RECENT_TOOL_LOOPS = 2
EVICTED_INPUT_EXCERPT_CHARS = 120
MIN_TRIM_RECLAIM_RATIO = 0.2
EXTRACTION_MIN_PENDING = 3
MEMORY_ITEM_MAX_CHARS = 500
TRANSCRIPT_CLIP_OVER_CHARS = 1_200
NON_TEXT_PART_CHARS = 2_000

# What the known agent harnesses inject into user turns (``harness_markers``): a marker written
# as a tag covers each ``<tag>…</tag>`` block of a text; any other marker is a prefix that makes
# a text starting with it the harness's whole.
DEFAULT_HARNESS_MARKERS = (
    "<system-reminder>",  # Claude Code: skills list, task-tool nudges, CLAUDE.md contents
    "<environment_context>",  # Codex: cwd, sandbox, approval policy, shell
    "<user_instructions>",  # Codex (older releases): AGENTS.md contents
    "# AGENTS.md instructions for",  # Codex: AGENTS.md contents in an <INSTRUCTIONS> block
    "<local-command-caveat>",  # Claude Code: the output of a local slash command follows
    "Here is a summary of the conversation to date:",  # LangChain SummarizationMiddleware
    "You are in the middle of a conversation that has been summarized.",  # deepagents
    "[SYSTEM] Goal ",  # deepagents: goal state and control messages
)
# Harness text holding one of these is a standing instruction, kept in every view
# (``standing_markers``).
DEFAULT_STANDING_MARKERS = (
    "Codebase and user instructions are shown below",  # Claude Code's CLAUDE.md reminder
    "You have been invoked in the following environment",  # Claude Code's environment block
    "# AGENTS.md instructions for",
    "<user_instructions>",
    "<environment_context>",
)
MAX_MARKERS = 64
MAX_MARKER_CHARS = 200

LANGUAGES = ("en", "zh")
# A compaction lease not renewed for this long lapses (store.lease_s); its holder renews it
# every third of that while the work runs, and a holder found dead on this host loses it at once.
DEFAULT_LEASE_S = 30.0
DEFAULT_MAX_ID_CHARS = 256  # max_id_chars: the longest session or user id taken
# Upper bounds of the numeric keys: past them a value passes nothing useful and overflows
# somewhere later (a date a TTL away, a thread wait's timeout, a pool size).
MAX_TIMEOUT_S = 86_400.0  # a day
MAX_TTL_DAYS = 36_500  # a century
MAX_CONTEXT_WINDOW_CHARS = 1_000_000_000
# The recall block of a session's later turns, by default (``recall.turn_chars``): each char of
# a new block is input no cache holds yet, and a kept block's chars leave the cached prefix when
# it is taken off. The largest cap measured that keeps §17's share per model call at 0.95 and
# up in every versus workload while keeping as much of BEAM and LoCoMo as no cap (the figures:
# ``benchmarks.turn_cap``, docs/benchmarks.md). A session's first turn has no cached
# conversation to lose: it takes the room.
RECALL_TURN_CHARS = 16_000
IDENTITIES = ("credential", "headers")  # serve.identity
_ENV_NAME = "an environment variable name"
MIN_SECRET_CHARS = 16  # serve.secret_env's value


def _clamp(value: float, low: int, high: int) -> int:
    return int(min(max(value, low), high))


def is_int(value: Any) -> bool:
    """An ``int`` proper: YAML's ``true`` is a bool, and a bool is not a count."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _field(key: str, default: Any, ok: Callable[[Any], bool], want: str) -> Any:
    """A field with a default that refuses what ``ok`` rejects, naming ``key``."""
    return attrs.field(default=default, validator=_check(key, ok, want))


def _flag(key: str, *, default: bool) -> Any:
    """A true/false field, refusing anything else (YAML's "yes" is a string here)."""
    return _field(key, default, lambda v: isinstance(v, bool), "true or false")


def _count(key: str, default: int, low: int, high: int) -> Any:
    """An integer field refusing values outside ``low..high``."""
    return _field(
        key, default, lambda v: is_int(v) and low <= v <= high, f"an integer {low}..{high}"
    )


def _seconds(key: str, default: float, high: float = MAX_TIMEOUT_S, *, zero: bool = False) -> Any:
    """A number field refusing values ≤ 0 (below 0 with ``zero``) or above ``high``."""
    low = ">= 0" if zero else "> 0"

    def ok(v: Any) -> bool:
        return _is_number(v) and (v >= 0 if zero else v > 0) and v <= high

    return _field(key, default, ok, f"a number {low} and <= {high:g}")


def _check(key: str, ok: Callable[[Any], bool], want: str) -> Callable[[Any, Any, Any], None]:
    """An attrs validator raising ConfigError with the key path and the bad value."""

    def validate(_instance: Any, _attribute: Any, value: Any) -> None:
        if not ok(value):
            raise ConfigError(key, f"expected {want}, got {value!r}")

    return validate


def _non_empty_str(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _env_name(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.replace("_", "").isalnum())


def _to_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list | tuple) else value


@attrs.frozen
class EndpointSettings:
    """One OpenAI-compatible endpoint. The API key is read from ``api_key_env`` at call time."""

    base_url: str = attrs.field(validator=_check("base_url", _non_empty_str, "a URL string"))
    model: str = attrs.field(validator=_check("model", _non_empty_str, "a model name"))
    api_key_env: str | None = _field("api_key_env", None, _env_name, _ENV_NAME)


@attrs.frozen
class LLMSettings:
    """The model endpoints used for summaries and memory extraction."""

    base_url: str = attrs.field(validator=_check("llm.base_url", _non_empty_str, "a URL string"))
    model: str = attrs.field(validator=_check("llm.model", _non_empty_str, "a model name"))
    api_key_env: str | None = _field("llm.api_key_env", None, _env_name, _ENV_NAME)
    timeout_s: float = _seconds("llm.timeout_s", 60.0)
    max_retries: int = _field("llm.max_retries", 3, lambda v: is_int(v) and 0 <= v <= 10, "0..10")
    max_input_chars: int = _count("llm.max_input_chars", 200_000, 10_000, MAX_CONTEXT_WINDOW_CHARS)
    offline_fallback: bool = _flag("llm.offline_fallback", default=True)
    # After a summary lost identifiers, ask the model once more naming them (a second call);
    # off, the engine restores them itself from the material (docs/design.md §6).
    retention_retry: bool = _flag("llm.retention_retry", default=False)
    fallbacks: tuple[EndpointSettings, ...] = attrs.field(
        default=(),
        converter=_to_tuple,
        validator=_check(
            "llm.fallbacks",
            lambda v: isinstance(v, tuple) and all(isinstance(e, EndpointSettings) for e in v),
            "a list of endpoints",
        ),
    )

    @property
    def endpoints(self) -> tuple[EndpointSettings, ...]:
        """The primary endpoint followed by the fallbacks, in the order they are tried."""
        return (EndpointSettings(self.base_url, self.model, self.api_key_env), *self.fallbacks)


@attrs.frozen
class StoreSettings:
    """Where the store lives: a SQLite file (``path``), or PostgreSQL (``url``) for many hosts,
    its password read from the variable ``password_env`` names (never in the YAML or URL)."""

    path: str = _field("store.path", "ragent-memory.db", _non_empty_str, "a file path")
    url: str | None = attrs.field(default=None, validator=lambda _i, _a, v: _check_pg_url(v))
    password_env: str | None = _field("store.password_env", None, _env_name, _ENV_NAME)
    pool_size: int = _count("store.pool_size", 8, 1, 1_000)
    lease_s: float = _seconds("store.lease_s", DEFAULT_LEASE_S, 3_600.0)

    def __attrs_post_init__(self) -> None:
        if self.url is None and self.password_env is not None:
            raise ConfigError("store.password_env", "needs store.url (PostgreSQL)")
        if self.url is not None and self.path != "ragent-memory.db":
            raise ConfigError(
                "store", "give store.path (SQLite) or store.url (PostgreSQL), not both"
            )

    def password(self) -> str | None:
        """The PostgreSQL password from ``password_env`` (None when no variable is named)."""
        if self.password_env is None:
            return None
        value = os.environ.get(self.password_env)
        if value is None:
            raise ConfigError(
                "store.password_env", f"environment variable {self.password_env} is not set"
            )
        return value


@attrs.frozen
class EmbeddingSettings:
    """``recall.embeddings`` (docs/design.md §9b, optional dense recall): an OpenAI-compatible
    ``/v1/embeddings`` endpoint whose vectors are fused with BM25; the key is read from
    ``api_key_env`` at call time."""

    base_url: str = attrs.field(
        validator=_check(
            "recall.embeddings.base_url",
            lambda v: v is not None and _http_url(v),
            "an http(s) base URL, e.g. http://h/v1",
        )
    )
    model: str = attrs.field(
        validator=_check("recall.embeddings.model", _non_empty_str, "a model name")
    )
    api_key_env: str | None = _field("recall.embeddings.api_key_env", None, _env_name, _ENV_NAME)
    timeout_s: float = _seconds("recall.embeddings.timeout_s", 10.0)
    batch_size: int = _field(
        "recall.embeddings.batch_size", 64, lambda v: is_int(v) and 1 <= v <= 2048, "1..2048"
    )


def _embeddings_section(value: Any) -> Any:
    if isinstance(value, Mapping):
        return _build(EmbeddingSettings, value, "recall.embeddings")
    return value


@attrs.frozen
class RecallSettings:
    """``recall``: what recall uses beyond BM25 (``recall_enabled`` switches recall itself),
    ``max_chars``, a cap on every recall block (None: the room the view leaves, up to B),
    and ``turn_chars``, a cap on the blocks of a session's later turns (None: none)."""

    max_chars: int | None = _field(
        "recall.max_chars",
        None,
        lambda v: v is None or (is_int(v) and 0 <= v <= MAX_CONTEXT_WINDOW_CHARS),
        f"null or an integer 0..{MAX_CONTEXT_WINDOW_CHARS}",
    )
    turn_chars: int | None = _field(
        "recall.turn_chars",
        RECALL_TURN_CHARS,
        lambda v: v is None or (is_int(v) and 0 <= v <= MAX_CONTEXT_WINDOW_CHARS),
        f"null or an integer 0..{MAX_CONTEXT_WINDOW_CHARS}",
    )

    embeddings: EmbeddingSettings | None = attrs.field(
        default=None,
        converter=_embeddings_section,
        validator=_check(
            "recall.embeddings",
            lambda v: v is None or isinstance(v, EmbeddingSettings),
            "a mapping {base_url, model, api_key_env}",
        ),
    )


def _check_pg_url(value: Any) -> None:
    """``store.url``: a ``postgresql://`` URL without a password (the error never echoes one)."""
    if value is None:
        return
    try:
        parts = urlsplit(value) if isinstance(value, str) else None
        has_password = parts is not None and parts.password is not None
    except ValueError:
        parts, has_password = None, False
    if parts is None or parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError("store.url", "expected a postgresql://host/database URL")
    if has_password:
        raise ConfigError(
            "store.url",
            "holds a password; put it in an environment variable named by store.password_env",
        )


def _http_url(value: Any) -> bool:
    if value is None:
        return True
    scheme, _, rest = value.partition("://") if isinstance(value, str) else ("", "", "")
    return scheme in ("http", "https") and bool(rest.strip("/"))


PROVIDERS = frozenset({"anthropic", "openai"})


def _to_pairs(value: Any) -> Any:
    return tuple(sorted(value.items())) if isinstance(value, Mapping) else value


def _provider_urls(value: Any) -> bool:
    return isinstance(value, tuple) and all(
        isinstance(pair, tuple) and pair[0] in PROVIDERS and pair[1] and _http_url(pair[1])
        for pair in value
    )


def _networks(value: Any) -> bool:
    try:
        ok = (isinstance(v, str) and ipaddress.ip_network(v, strict=False) for v in value)
        return isinstance(value, tuple) and all(ok)
    except (TypeError, ValueError):
        return False


@attrs.frozen
class ServeSettings:
    """``ragent-memory serve`` (docs/design.md §14b): the OpenAI-compatible proxy and its bounds."""

    upstream: str | None = _field(
        "serve.upstream", None, _http_url, "an http(s) base URL, e.g. http://h/v1"
    )
    host: str = _field("serve.host", "127.0.0.1", _non_empty_str, "a host name")
    port: int = _field("serve.port", 8089, lambda v: is_int(v) and 0 <= v <= 65535, "0..65535")
    max_body_bytes: int = _count("serve.max_body_bytes", 32 * 1024 * 1024, 1024, 1 << 31)
    timeout_s: float = _seconds("serve.timeout_s", 600.0)
    max_concurrency: int = _field(
        "serve.max_concurrency", 64, lambda v: is_int(v) and 1 <= v <= 10_000, "1..10000"
    )
    max_tool_rounds: int = _field(
        "serve.max_tool_rounds", 3, lambda v: is_int(v) and 0 <= v <= 10, "0..10"
    )
    # How long a caller may take to send a request's head, and then its body (whole); past
    # it a 408 and the connection closed. A body being read holds no in-flight slot.
    header_timeout_s: float = _seconds("serve.header_timeout_s", 60.0, 3600)
    body_timeout_s: float = _seconds("serve.body_timeout_s", 60.0, 3600)
    # Open connections from one client address (trusted_proxies are not counted).
    max_connections_per_peer: int = _count("serve.max_connections_per_peer", 64, 1, 100_000)
    # Who a request speaks for (serve/identity.py): its credential, or trusted headers.
    identity: str = _field(
        "serve.identity", "credential", IDENTITIES.__contains__, "credential or headers"
    )
    secret_env: str | None = _field("serve.secret_env", None, _env_name, "a variable name")
    allow_anonymous: bool = _flag("serve.allow_anonymous", default=False)
    trusted_proxies: tuple[str, ...] = attrs.field(
        default=(),
        converter=_to_tuple,
        validator=_check("serve.trusted_proxies", _networks, "a list of addresses or CIDRs"),
    )
    # Per provider, a base URL that replaces ``upstream`` for its wire formats (anthropic:
    # /v1/messages; openai: /v1/chat/completions and /v1/responses).
    upstreams: tuple[tuple[str, str], ...] = attrs.field(
        default=(),
        converter=_to_pairs,
        validator=_check("serve.upstreams", _provider_urls, "{anthropic: URL, openai: URL}"),
    )

    def __attrs_post_init__(self) -> None:
        if self.identity == "headers" and not (self.trusted_proxies or is_loopback(self.host)):
            raise ConfigError(
                "serve.trusted_proxies", f"required for identity: headers on host {self.host}"
            )

    def upstream_for(self, provider: str) -> str | None:
        """The base URL of ``provider``'s formats: its ``upstreams`` entry, else ``upstream``."""
        return dict(self.upstreams).get(provider) or self.upstream

    def secret(self) -> bytes | None:
        """The scope secret from ``secret_env`` (None when no variable is named)."""
        value = env_value("serve.secret_env", self.secret_env) if self.secret_env else ""
        if value and len(value) < MIN_SECRET_CHARS:
            raise ConfigError("serve.secret_env", f"under {MIN_SECRET_CHARS} characters")
        return value.encode() or None


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost`` or a loopback address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def env_value(key_path: str, name: str) -> str:
    """The value of the environment variable ``name``, which ``key_path`` names."""
    value = os.environ.get(name)
    if not value:
        raise ConfigError(key_path, f"environment variable {name} is not set")
    return value


def _tool_names(value: Any) -> bool:
    return isinstance(value, tuple) and all(_non_empty_str(v) for v in value)


def _markers(key: str) -> Callable[[Any, Any, Any], None]:
    """A validator of a marker list, naming the entry at fault (``harness_markers[2]``)."""

    def validate(_instance: Any, _attribute: Any, value: Any) -> None:
        if not isinstance(value, tuple) or len(value) > MAX_MARKERS:
            raise ConfigError(key, f"expected a list of at most {MAX_MARKERS} strings")
        for index, marker in enumerate(value):
            if not _non_empty_str(marker) or len(marker) > MAX_MARKER_CHARS:
                raise ConfigError(
                    f"{key}[{index}]",
                    f"expected a non-empty string of at most {MAX_MARKER_CHARS} chars,"
                    f" got {marker!r}",
                )

    return validate


def _nested(key: str, value: Any) -> Any:
    """Settings built in code may give a nested section as a mapping, as in the YAML file
    (``store={"path": "m.db"}``), or the store as a bare path."""
    if isinstance(value, Mapping):
        return _build(_SECTIONS[key], value, key)
    if key == "store" and isinstance(value, str | Path):
        return StoreSettings(path=str(value))
    return value


def _store_section(value: Any) -> Any:
    return _nested("store", value)


def _llm_section(value: Any) -> Any:
    return _nested("llm", value)


def _serve_section(value: Any) -> Any:
    return _nested("serve", value)


def _recall_section(value: Any) -> Any:
    return _nested("recall", value)


# The derived gates ``Settings.derived`` shows, in order.
_DERIVED = """context_window_chars trim_trigger_chars compact_trigger_chars keep_recent_chars
    summary_max_chars memory_max_chars memory_consolidate_chars oversized_tool_result_chars
    recall_max_chars recall_floor_chars"""


@attrs.frozen
class Settings:
    """Every setting of the engine. Construct in code or with :func:`load_settings`."""

    context_window_chars: int = _count(
        "context_window_chars", 1_200_000, MIN_CONTEXT_WINDOW_CHARS, MAX_CONTEXT_WINDOW_CHARS
    )
    summary_enabled: bool = _flag("summary_enabled", default=True)
    long_term_enabled: bool = _flag("long_term_enabled", default=True)
    evictable_tools: tuple[str, ...] = attrs.field(
        default=("search_knowledge",),
        converter=_to_tuple,
        validator=_check("evictable_tools", _tool_names, "a list of tool names"),
    )
    language: str = _field("language", "en", lambda v: v in LANGUAGES, "'en' or 'zh'")
    store: StoreSettings = attrs.field(
        factory=StoreSettings,
        converter=_store_section,
        validator=_check("store", lambda v: isinstance(v, StoreSettings), "StoreSettings"),
    )
    compaction_timeout_s: float = _seconds("compaction_timeout_s", 120.0, zero=True)
    compaction_workers: int = _field(
        "compaction_workers", 2, lambda v: is_int(v) and 1 <= v <= 64, "an integer 1..64"
    )
    session_cache_size: int = _count("session_cache_size", 1000, 1, 10_000_000)
    offload_ttl_days: float = _seconds("offload_ttl_days", 7, MAX_TTL_DAYS)
    strict_alternation: bool = _flag("strict_alternation", default=False)
    recall_enabled: bool = _flag("recall_enabled", default=True)
    # the in-process recall index's memory (§9b, §17): least recently searched users out first
    recall_memory_mb: int = _count("recall_memory_mb", 128, 1, 1 << 20)
    # The longest session or user id ``prepare`` and its siblings take (the proxy's scope
    # prefix counts): a longer one is refused before anything is written.
    max_id_chars: int = _count("max_id_chars", DEFAULT_MAX_ID_CHARS, 32, 1 << 20)
    preserved_tools: tuple[str, ...] = attrs.field(
        default=(),
        converter=_to_tuple,
        validator=_check("preserved_tools", _tool_names, "a list of tool names"),
    )
    # Provenance: text the agent harness injects into user turns is never the user's words;
    # harness text holding a standing marker is kept in every view, never summarized.
    harness_markers: tuple[str, ...] = attrs.field(
        default=DEFAULT_HARNESS_MARKERS, converter=_to_tuple, validator=_markers("harness_markers")
    )
    standing_markers: tuple[str, ...] = attrs.field(
        default=DEFAULT_STANDING_MARKERS,
        converter=_to_tuple,
        validator=_markers("standing_markers"),
    )
    recall: RecallSettings = attrs.field(
        factory=RecallSettings,
        converter=_recall_section,
        validator=_check("recall", lambda v: isinstance(v, RecallSettings), "RecallSettings"),
    )
    llm: LLMSettings | None = attrs.field(
        default=None,
        converter=_llm_section,
        validator=_check(
            "llm", lambda v: v is None or isinstance(v, LLMSettings), "LLMSettings or None"
        ),
    )

    serve: ServeSettings = attrs.field(
        factory=ServeSettings,
        converter=_serve_section,
        validator=_check("serve", lambda v: isinstance(v, ServeSettings), "ServeSettings"),
    )

    # Derived values (docs/design.md §1). Read-only: they follow B.
    @property
    def trim_trigger_chars(self) -> int:
        return int(0.5 * self.context_window_chars)

    @property
    def compact_trigger_chars(self) -> int:
        return int(0.8 * self.context_window_chars)

    @property
    def keep_recent_chars(self) -> int:
        return int(0.2 * self.context_window_chars)

    @property
    def summary_max_chars(self) -> int:
        return _clamp(0.1 * self.context_window_chars, 1_500, 6_000)

    @property
    def memory_max_chars(self) -> int:
        return _clamp(0.005 * self.context_window_chars, 1_500, 6_000)

    @property
    def memory_consolidate_chars(self) -> int:
        return int(0.75 * self.memory_max_chars)

    @property
    def oversized_tool_result_chars(self) -> int:
        return _clamp(0.05 * self.context_window_chars, 4_000, 50_000)

    @property
    def recall_max_chars(self) -> int:
        """The recall block's cap (docs/design.md §9b): ``recall.max_chars`` if set, else B
        (the block takes the room the view leaves)."""
        cap = self.recall.max_chars
        return self.context_window_chars if cap is None else cap

    @property
    def recall_floor_chars(self) -> int:
        """The room a turn's block is owed (docs/design.md §9b): earlier turns' kept blocks
        are taken off when they would leave it less than half of this, clamp(0.2 × B,
        1,000, 40,000) within ``recall_max_chars`` and ``recall.turn_chars`` (a later turn's
        block asks no more room than that)."""
        floor = min(self.recall_max_chars, _clamp(0.2 * self.context_window_chars, 1_000, 40_000))
        turn = self.recall.turn_chars
        return floor if turn is None else min(floor, turn)

    @property
    def verbatim_max_chars(self) -> int:
        """Room for the user's own words under ``## User requests`` (30% of the summary)."""
        return int(0.3 * self.summary_max_chars)

    @property
    def preserved_max_chars(self) -> int:
        """Room for the preserved tool outputs after the summary (20% of the summary)."""
        return int(0.2 * self.summary_max_chars)

    def derived(self) -> dict[str, int]:
        """The derived gates, by name, for display (``ragent-memory inspect``)."""
        return {name: getattr(self, name) for name in _DERIVED.split()}


def _value(cls: type[Any], key: str, value: Any, key_path: str) -> Any:
    """One key's YAML value as its field takes it: a nested section built, lists checked."""
    if cls is Settings and key in _SECTIONS:
        return None if key == "llm" and value is None else _build(_SECTIONS[key], value, key_path)
    if cls is Settings and key in ("evictable_tools", "preserved_tools"):
        if not isinstance(value, list):
            raise ConfigError(key_path, f"expected a list of tool names, got {value!r}")
    elif cls is Settings and key in ("harness_markers", "standing_markers"):
        if not isinstance(value, list):
            raise ConfigError(key_path, f"expected a list of strings, got {value!r}")
    elif cls is RecallSettings and key == "embeddings":
        return None if value is None else _build(EmbeddingSettings, value, key_path)
    elif cls is LLMSettings and key == "fallbacks":
        if not isinstance(value, list):
            raise ConfigError(key_path, f"expected a list of endpoints, got {value!r}")
        return tuple(_build(EndpointSettings, v, f"{key_path}[{i}]") for i, v in enumerate(value))
    return value


def _build(cls: type[Any], data: Any, path: str) -> Any:
    """Build an attrs settings class from a mapping, naming the key path on every error."""
    if not isinstance(data, Mapping):
        raise ConfigError(path or "(top level)", f"expected a mapping, got {data!r}")
    known = {a.name: a for a in attrs.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        key_path = f"{path}.{key}" if path else str(key)
        if key not in known:
            raise ConfigError(key_path, f"unknown key (known: {', '.join(sorted(known))})")
        kwargs[key] = _value(cls, key, value, key_path)
    for name, field in known.items():
        if field.default is attrs.NOTHING and name not in kwargs:
            raise ConfigError(f"{path}.{name}" if path else name, "required key is missing")
    try:
        return cls(**kwargs)
    except ConfigError as err:
        if path and not err.key_path.startswith(path):
            raise ConfigError(f"{path}.{err.key_path}", err.problem) from None
        raise
    except TypeError as err:  # a required key is missing
        raise ConfigError(path or "(top level)", str(err)) from None


_SECTIONS: Mapping[str, type] = MappingProxyType(
    {
        "store": StoreSettings,
        "llm": LLMSettings,
        "serve": ServeSettings,
        "recall": RecallSettings,
    }
)


def settings_from_dict(data: Mapping[str, Any]) -> Settings:
    """Settings from a parsed YAML/JSON mapping."""
    return cast(Settings, _build(Settings, data, ""))


def _where(err: yaml.YAMLError) -> str:
    """Where and what, in one line (PyYAML's own message spans lines and names no file)."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or "not valid YAML"
    at = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
    return f"{at}: {problem}"


def load_settings(path: str | Path) -> Settings:
    """Read ``config/ragent-memory.yaml`` (or any path). An empty file gives the defaults."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError("", f"cannot read config file {str(path)!r}: {err.strerror}") from err
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError("", f"{path}: invalid YAML{_where(err)}") from None
    return settings_from_dict(data or {})
