"""The llm room (DESIGN §16)."""
