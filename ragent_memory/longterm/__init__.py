"""Long-term memory (docs/design.md §9): durable facts about a user, learnt from the user's own
words and shown as a clamped block. The offline extractor (``offline``, ``clauses``,
``patterns``) and the model extractor (``model``, ``grounds``) propose operations
(``operations``) that one batch applies within the block's cap (``batch``); ``vocabulary``
holds the words both share."""
