"""The OpenAI-compatible client (docs/design.md §7): retries owned here, failover to the
configured fallbacks, the circuit breaker (``client``); building the summarizer's and the
extractor's clients from settings (``build``); the optional embeddings endpoint for dense
recall (``embeddings``)."""
