"""ragent_memory: keep an agent's prompt inside one character budget without losing what matters.

::

    from ragent_memory import MemoryEngine, load_settings

    engine = MemoryEngine(load_settings("config/ragent-memory.yaml"))
    prepared = engine.prepare(messages, session_id="s1", user_id="u1")
    prepared.messages   # send these to the model
    prepared.report     # TurnReport, in characters
    engine.after_turn(messages, session_id="s1", user_id="u1")   # learn durable facts
"""

from importlib.metadata import PackageNotFoundError, version

from ragent_memory.core.chars import chars
from ragent_memory.core.records import Fact
from ragent_memory.engine.memory_engine import MemoryEngine, PreparedContext, TurnReport
from ragent_memory.errors import (
    ConfigError,
    EngineClosedError,
    InvalidIdError,
    InvalidMessagesError,
    LLMError,
    RagentMemoryError,
    StoreError,
    SummaryError,
)
from ragent_memory.settings import (
    EndpointSettings,
    LLMSettings,
    Settings,
    StoreSettings,
    load_settings,
)
from ragent_memory.store import GCReport

try:
    __version__ = version("ragent-memory")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "ConfigError",
    "EndpointSettings",
    "EngineClosedError",
    "Fact",
    "GCReport",
    "InvalidIdError",
    "InvalidMessagesError",
    "LLMError",
    "LLMSettings",
    "MemoryEngine",
    "PreparedContext",
    "RagentMemoryError",
    "Settings",
    "StoreError",
    "StoreSettings",
    "SummaryError",
    "TurnReport",
    "__version__",
    "chars",
    "load_settings",
]
