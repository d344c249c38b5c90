"""ragent_memory: keep an agent's prompt inside one character budget without losing what matters."""

from .errors import (
    ConfigError,
    InvalidMessagesError,
    LLMError,
    RagentMemoryError,
    StoreError,
    SummaryError,
)
from .settings import EndpointSettings, LLMSettings, Settings, StoreSettings, load_settings

__all__ = [
    "ConfigError",
    "EndpointSettings",
    "InvalidMessagesError",
    "LLMError",
    "LLMSettings",
    "RagentMemoryError",
    "Settings",
    "StoreError",
    "StoreSettings",
    "SummaryError",
    "load_settings",
]
