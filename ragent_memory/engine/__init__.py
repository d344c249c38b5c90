"""The engine room (DESIGN §16): session state, the turn pipeline, ``MemoryEngine`` and its tools."""

from ragent_memory.engine.memory_engine import MemoryEngine, PreparedContext, TurnReport

__all__ = ["MemoryEngine", "PreparedContext", "TurnReport"]
