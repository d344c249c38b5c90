"""Recall (docs/design.md §8, §9b): what left the view, brought back when a question needs
it. ``index`` writes a session's messages to the store's recall index; ``rank`` and ``topk``
rank them in process; ``excerpts`` renders the block; ``dense`` adds optional embeddings;
``refs`` serves the ``recall_tool_result`` tool; ``recaller`` is what the engine uses of all
of it."""
