"""The core room (DESIGN §16)."""
