"""The engine (docs/design.md §1, §11): one session's state and its turn pipeline
(``session``, ``view``, ``raw``, ``sticky``, ``trimming``, ``ladder``, ``compaction``,
``turn_recall``), ``MemoryEngine`` that owns the threads and the store, long-term memory's
block and background work (``memory``, ``background``), and the tools it offers (``tools``)."""

from ragent_memory.engine.memory_engine import MemoryEngine, PreparedContext, TurnReport

__all__ = ["MemoryEngine", "PreparedContext", "TurnReport"]
