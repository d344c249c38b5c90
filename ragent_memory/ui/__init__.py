"""``ragent-memory ui``: a local audit page over a store (the ``ui`` extra)."""
