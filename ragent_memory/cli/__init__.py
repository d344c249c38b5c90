"""The ``ragent-memory`` command line (docs/design.md §14): commands, the demo, transcripts."""

from ragent_memory.cli import page  # noqa: F401 - registers ``ui`` and ``probe``
from ragent_memory.cli.main import cli, main

__all__ = ["cli", "main"]
