"""What the memory did, read back from a store: fidelity probes of each compaction."""

from ragent_memory.audit.probes import (
    KEPT,
    LOST,
    OUTCOMES,
    RECALLABLE,
    GenerationProbes,
    Probe,
    SessionProbes,
    probe_session,
)

__all__ = [
    "KEPT",
    "LOST",
    "OUTCOMES",
    "RECALLABLE",
    "GenerationProbes",
    "Probe",
    "SessionProbes",
    "probe_session",
]
