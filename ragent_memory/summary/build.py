"""Which summarizer an engine uses: the offline one, or a model with it as the fallback
(apart from both, so imports point one way: build → offline → summarize)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ragent_memory.core.logs import EventCallback
from ragent_memory.llm.build import with_model
from ragent_memory.settings import LLMSettings, Settings
from ragent_memory.summary.offline import OfflineSummarizer
from ragent_memory.summary.summarize import ModelSummarizer, Summarizer

if TYPE_CHECKING:
    from ragent_memory.llm.client import LLMClient


def build_summarizer(
    settings: Settings,
    *,
    on_event: EventCallback | None = None,
    sleep: Callable[[float], None] | None = None,
) -> Summarizer:
    """The offline summarizer, or a model summarizer when ``llm`` is configured."""

    def model(client: LLMClient, llm: LLMSettings, offline: Summarizer | None) -> Summarizer:
        return ModelSummarizer(
            client,
            model=llm.model,
            max_input_chars=llm.max_input_chars,
            offline=offline,
            on_event=on_event,
            retention_retry=llm.retention_retry,
        )

    offline: Summarizer = OfflineSummarizer()
    return with_model(settings, offline, model, on_event=on_event, sleep=sleep)
