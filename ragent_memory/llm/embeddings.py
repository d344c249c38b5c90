"""The client of an OpenAI-compatible ``/v1/embeddings`` endpoint (``recall.embeddings``,
docs/design.md §9b): the official ``openai`` SDK's ``embeddings.create``, one HTTP call per batch,
bounded by ``timeout_s`` and never retried (the SDK's ``max_retries=0``): dense recall is help,
so a failure costs one call, counted, and the caller goes on without it. After
``BREAKER_FAILURES`` failures in a row the endpoint is skipped for ``BREAKER_COOLDOWN_S``
(``CircuitBreaker``), so a server that is down does not cost every turn a timeout. A batch the
endpoint refuses as bad input (HTTP 400, 413 or 422) raises ``EmbeddingRejected``: the endpoint
answered, so the breaker is not moved, and the caller can find the text it refuses. The key is
read from ``api_key_env`` at call time, sent per request, and never in an error's text."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt
import openai

from ragent_memory.core.chars import clip
from ragent_memory.errors import LLMError
from ragent_memory.llm.client import CircuitBreaker
from ragent_memory.settings import EmbeddingSettings

BREAKER_FAILURES: Final = 3
BREAKER_COOLDOWN_S: Final = 30.0
_NO_KEY: Final = "unused"  # sent when no key is named (local servers)
_DETAIL_CHARS: Final = 300
MAX_INPUT_CHARS: Final = 2_000  # a text's head sent (embedding models take a few hundred tokens)

REJECTED: Final = frozenset({400, 413, 422})  # the input, not the endpoint, is at fault

Vectors = npt.NDArray[np.float32]


class EmbeddingRejected(LLMError):
    """The endpoint refused the texts themselves (a status in ``REJECTED``): sending them
    again gets the same answer."""


class EmbeddingClient:
    """Texts to vectors through one endpoint. Thread-safe; counts its calls and failures."""

    def __init__(
        self, settings: EmbeddingSettings, *, breaker: CircuitBreaker | None = None
    ) -> None:
        self.settings = settings
        self._client = openai.OpenAI(
            base_url=settings.base_url,
            api_key=_NO_KEY,  # the real key goes in a per-request header
            max_retries=0,
            timeout=settings.timeout_s,
        )
        self._breaker = breaker or CircuitBreaker(
            failures=BREAKER_FAILURES, cooldown_s=BREAKER_COOLDOWN_S
        )
        self._lock = threading.Lock()
        self.calls = 0
        self.failures = 0  # failed calls, and calls skipped while the breaker was open

    @property
    def accepted(self) -> int:
        """The calls that returned vectors."""
        with self._lock:
            return self.calls - self.failures

    def embed(self, texts: Sequence[str]) -> Vectors:
        """One vector per text (rows of a float32 matrix, in order); raises ``LLMError``."""
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        key = self.settings.base_url
        if self._breaker.is_open(key):
            self._count(failed=True)
            raise LLMError(f"recall.embeddings: {key} skipped after repeated failures")
        secret = self._key()
        try:
            reply = self._client.embeddings.create(
                model=self.settings.model,
                input=[text[:MAX_INPUT_CHARS] or " " for text in texts],
                encoding_format="float",
                extra_headers={"Authorization": f"Bearer {secret}"},
            )
            vectors = _matrix(reply, len(texts))
        except (openai.OpenAIError, ValueError) as err:
            self._count(failed=True)
            detail = clip(str(err).replace(secret, "[redacted]"), _DETAIL_CHARS)
            message = f"recall.embeddings: {type(err).__name__}: {detail}"
            if isinstance(err, openai.APIStatusError) and err.status_code in REJECTED:
                raise EmbeddingRejected(message) from None
            self._breaker.record_failure(key)
            raise LLMError(message) from None
        self._count(failed=False)
        self._breaker.record_success(key)
        return vectors

    def _key(self) -> str:
        name = self.settings.api_key_env
        if name is None:
            return _NO_KEY
        value = os.environ.get(name)
        if not value:
            self._count(failed=True)
            raise LLMError(f"recall.embeddings.api_key_env: variable {name} is not set")
        return value

    def _count(self, *, failed: bool) -> None:
        with self._lock:
            self.calls += 1
            self.failures += failed

    def close(self) -> None:
        self._client.close()


def _matrix(reply: object, count: int) -> Vectors:
    """The reply's vectors in input order; ``ValueError`` for a reply that is not one vector
    of finite numbers per input, all of one length."""
    data = getattr(reply, "data", None)
    if not isinstance(data, list) or len(data) != count:
        raise ValueError(f"expected {count} embeddings, got {type(data).__name__}")
    ordered = sorted(data, key=lambda item: getattr(item, "index", 0))
    rows = [getattr(item, "embedding", None) for item in ordered]
    if not all(isinstance(row, list) and row for row in rows):
        raise ValueError("an embedding is missing or empty")
    width = len(rows[0])  # type: ignore[arg-type]
    if any(len(row) != width for row in rows):  # type: ignore[arg-type]
        raise ValueError("embeddings of different lengths")
    try:
        vectors = np.asarray(rows, dtype=np.float32)
    except TypeError:
        raise ValueError("an embedding holds a value that is not a number") from None
    if not np.isfinite(vectors).all():
        raise ValueError("an embedding holds a value that is not a finite number")
    return vectors
