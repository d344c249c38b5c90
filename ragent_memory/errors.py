"""The exception tree of ragent_memory.

::

    RagentMemoryError
    ├── ConfigError            (also a ValueError)  bad settings; ``key_path`` names the key
    ├── InvalidMessagesError   (also a ValueError)  bad chat history; ``index`` names the message
    │   └── InvalidIdError                          a bad session or user id; ``field`` names it
    ├── SummaryError                                a summary was rejected (``reason``)
    │   └── ExtractionError                         memory operations were rejected
    ├── LLMError                                    every endpoint failed (``attempts``)
    ├── EngineClosedError                           a call after ``MemoryEngine.close()``
    └── StoreError                                  the SQLite store failed

Only ``cli.py`` turns these into exit codes."""

from __future__ import annotations


class RagentMemoryError(Exception):
    """Root of every error this library raises on purpose."""


class ConfigError(RagentMemoryError, ValueError):
    """A setting is unknown, of the wrong type or out of range."""

    def __init__(self, key_path: str, problem: str) -> None:
        self.key_path = key_path
        self.problem = problem
        super().__init__(f"{key_path}: {problem}" if key_path else problem)


class InvalidMessagesError(RagentMemoryError, ValueError):
    """The chat history handed to the engine is not a valid list of OpenAI messages."""

    def __init__(self, index: int | None, problem: str) -> None:
        self.index = index
        self.problem = problem
        where = "messages" if index is None else f"messages[{index}]"
        super().__init__(f"{where}: {problem}")


class InvalidIdError(InvalidMessagesError):
    """A session or user id is not a non-empty string of valid text within ``max_id_chars``;
    ``field`` is ``session_id`` or ``user_id``, ``limit`` the length bound."""

    def __init__(self, field: str, problem: str, *, limit: int) -> None:
        super().__init__(None, problem)
        self.field = field
        self.limit = limit
        self.args = (f"{field}: {problem}",)

    def __str__(self) -> str:
        return str(self.args[0])


class SummaryError(RagentMemoryError):
    """A summary (from a model or the offline summarizer) failed validation."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class ExtractionError(SummaryError):
    """Model output for long-term memory is not valid operations (retried like a bad reply)."""


class LLMError(RagentMemoryError):
    """Every configured endpoint failed; ``attempts`` counts the calls made."""

    def __init__(self, message: str, *, attempts: int = 0) -> None:
        self.attempts = attempts
        super().__init__(message)


class EngineClosedError(RagentMemoryError):
    """The engine was closed; it takes no more calls."""


class StoreError(RagentMemoryError):
    """The SQLite store could not be opened, migrated, read or written."""
