"""The engine's own tools as a model calls them: untrusted arguments in, one text answer out.

Models add arguments nobody declared (``reason``), send numbers as strings (``"8000"``) or
forget required ones. :func:`call_tool` ignores unknown keys, coerces what is clearly meant,
and answers everything else with a one-line refusal the model can read — never an exception.
The framework adapters (``ragent_memory.integrations``) route their tool calls through it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from ragent_memory.core.logs import get_logger
from ragent_memory.errors import StoreError
from ragent_memory.recall.recaller import DEFAULT_SEARCH_LIMIT, SEARCH_TOOL_NAME, search_tool_schema
from ragent_memory.recall.refs import (
    DEFAULT_LIMIT,
    RECALL_TOOL_NAME,
    recall_slice,
    recall_tool_schema,
)
from ragent_memory.settings import Settings
from ragent_memory.store import OffloadStore

log = get_logger(__name__)


class ToolHost(Protocol):
    """What the tools need of an engine (``MemoryEngine`` is one)."""

    @property
    def settings(self) -> Settings: ...

    def recall(self, session_id: str, ref: str, offset: int = ..., limit: int = ...) -> str: ...

    def search(
        self, session_id: str, query: str, user_id: str | None = ..., limit: int = ...
    ) -> str: ...


def read_back(store: OffloadStore, session_id: Any, ref: Any, offset: Any, limit: Any) -> str:
    """``original[offset:offset + limit]`` of the session's offloaded original ``ref``, with
    its footer; a refusal the model can read for anything else (a ref unknown, expired or
    another session's, a bad offset or limit, a store that cannot be read now)."""
    key = ref.strip() if isinstance(ref, str) else None
    original = None
    if key and isinstance(session_id, str):
        try:
            original = store.read_offload(session_id, key)
        except StoreError as err:
            log.error("recall.failed", session_id=session_id, ref=key, error=repr(err))
            return "[recall: the store could not be read just now; try again later]"
    return recall_slice(original, ref, as_int(offset), as_int(limit))


def parse_arguments(arguments: Any) -> dict[str, Any] | None:
    """A tool call's arguments as a dict (JSON text or a mapping); None when they are neither."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError:
            return None
    if isinstance(arguments, Mapping):
        return dict(arguments)
    return None


def as_int(value: Any) -> Any:
    """``"8000"`` and ``8000.0`` as 8000; anything else unchanged (the callee refuses it)."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def memory_tools(engine: ToolHost) -> list[dict[str, Any]]:
    """The OpenAI schemas of the engine's tools: recall, and search unless recall is off."""
    if not engine.settings.recall_enabled:
        return [recall_tool_schema()]
    return [recall_tool_schema(), search_tool_schema()]


def call_tool(
    engine: ToolHost,
    name: str,
    arguments: Any,
    *,
    session_id: str,
    user_id: str | None = None,
) -> str:
    """Answer one call of the engine's tools ``name`` with ``arguments`` (JSON or a mapping)."""
    args = parse_arguments(arguments)
    if args is None:
        return f"[{name}: arguments must be a JSON object, got {str(arguments)[:80]!r}]"
    if name == RECALL_TOOL_NAME:
        ref = args.get("ref")
        if not isinstance(ref, str) or not ref.strip():
            return '[recall: "ref" is required, e.g. {"ref": "rm-…"}]'
        offset = as_int(args.get("offset", 0))
        limit = as_int(args.get("limit", DEFAULT_LIMIT))
        return engine.recall(session_id, ref, offset, limit)
    if name == SEARCH_TOOL_NAME:
        query = args.get("query")
        if not isinstance(query, str) or not query.strip():
            return '[search_memory: "query" is required, e.g. {"query": "refund window"}]'
        limit = as_int(args.get("limit", DEFAULT_SEARCH_LIMIT))
        return engine.search(session_id, query, user_id, limit)
    return f"[{name}: not a ragent_memory tool]"
