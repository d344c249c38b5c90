"""The engine's background work: compactions and fact extractions, each on its own thread
pool, and the futures in flight, so ``flush`` and ``close`` can wait for all of them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

MEMORY_WORKERS = 2  # background fact extractions at once (one per user at most)


class Background:
    """The two thread pools and the work in flight on them. ``submit_*`` return None when the
    pool takes no more work (the engine is closing)."""

    def __init__(self, compaction_workers: int) -> None:
        self._compactions = ThreadPoolExecutor(compaction_workers, "ragent-compact")
        self._extractions = ThreadPoolExecutor(MEMORY_WORKERS, "ragent-memory")
        self._lock = threading.Lock()
        self._futures: set[Future[Any]] = set()

    def submit_compaction(
        self, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Future[Any] | None:
        return self._submit(self._compactions, fn, *args, **kwargs)

    def submit_extraction(self, fn: Callable[..., Any], *args: Any) -> Future[Any] | None:
        return self._submit(self._extractions, fn, *args)

    def _submit(
        self, pool: ThreadPoolExecutor, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Future[Any] | None:
        try:
            future = pool.submit(fn, *args, **kwargs)
        except RuntimeError:  # the pool is shut down
            return None
        with self._lock:
            self._futures.add(future)
        future.add_done_callback(self._done)
        return future

    def _done(self, future: Future[Any]) -> None:
        with self._lock:
            self._futures.discard(future)

    def wait(self, timeout_s: float | None) -> bool:
        """Wait for the work in flight now; True when all of it finished within the time."""
        with self._lock:
            futures = list(self._futures)
        return not wait(futures, timeout=timeout_s).not_done

    def shutdown(self) -> None:
        """Take no more work and wait for what runs (extractions first, then compactions)."""
        self._extractions.shutdown(wait=True)
        self._compactions.shutdown(wait=True)
