"""A model-backed summarizer or extractor when ``llm`` is configured, else the offline one
(``openai`` is imported only then)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ragent_memory.core.logs import EventCallback
from ragent_memory.settings import LLMSettings, Settings

if TYPE_CHECKING:
    from ragent_memory.llm.client import LLMClient


M = TypeVar("M")  # a summarizer or an extractor


def with_model(
    settings: Settings,
    offline: M,
    model: Callable[[LLMClient, LLMSettings, M | None], M],
    *,
    on_event: EventCallback | None = None,
    sleep: Callable[[float], None] | None = None,
) -> M:
    """``offline`` when no ``llm`` is configured, else ``model(client, llm, fallback)`` with
    ``offline`` as the fallback unless ``llm.offline_fallback`` is off."""
    if settings.llm is None:
        return offline
    from ragent_memory.llm.client import LLMClient

    client = LLMClient(settings.llm, on_event=on_event, sleep=sleep or time.sleep)
    return model(client, settings.llm, offline if settings.llm.offline_fallback else None)
