"""Logging: a library is silent until its app asks (docs/design.md §13).

Events go to the ``logging`` logger ``ragent_memory.<module>``, shaped by the app's structlog
processors when it configured structlog, else as one ``event key=value …`` line with the fields
on the ``LogRecord`` as ``ragent_event``. The library never calls ``structlog.configure()``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping
from typing import Any

import structlog

ROOT = "ragent_memory"
EVENT_ATTR = "ragent_event"

# An app's ``on_event(name, payload)`` callback (docs/design.md §13): summaries' progress, not logs.
EventCallback = Callable[[str, dict[str, Any]], None]

logging.getLogger(ROOT).addHandler(logging.NullHandler())


def _to_log_kwargs(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> dict[str, Any]:
    """Render ``event k=v …`` as the message and keep the fields on the record."""
    fields = " ".join(f"{k}={v!r}" for k, v in event_dict.items() if k != "event")
    message = f"{event_dict.get('event', '')} {fields}".rstrip()
    return {"msg": message, "extra": {EVENT_ATTR: dict(event_dict)}}


class Logger:
    """The bound logger every module uses: ``log.info("trim.applied", session_id=…)``."""

    def __init__(self, name: str) -> None:
        self._stdlib = logging.getLogger(name)

    def _log(self, level: int, method: str, event: str, fields: dict[str, Any]) -> None:
        if structlog.is_configured():
            bound = structlog.wrap_logger(self._stdlib)
        elif self._stdlib.isEnabledFor(level):
            bound = structlog.wrap_logger(
                self._stdlib,
                processors=(_to_log_kwargs,),
                wrapper_class=structlog.stdlib.BoundLogger,
            )
        else:
            return
        getattr(bound, method)(event, **fields)

    def info(self, event: str, /, **fields: Any) -> None:
        self._log(logging.INFO, "info", event, fields)

    def warning(self, event: str, /, **fields: Any) -> None:
        self._log(logging.WARNING, "warning", event, fields)

    def error(self, event: str, /, **fields: Any) -> None:
        self._log(logging.ERROR, "error", event, fields)


def get_logger(name: str) -> Logger:
    """The logger for a module of this package (``__name__``), under ``ragent_memory``."""
    return Logger(name)
